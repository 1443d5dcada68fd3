ALTER TABLE "requests" ADD COLUMN "prefill_instance_id" text;--> statement-breakpoint
ALTER TABLE "requests" ADD COLUMN "decode_instance_id" text;--> statement-breakpoint
ALTER TABLE "requests" ADD COLUMN "ended_at" timestamp with time zone;--> statement-breakpoint
ALTER TABLE "shards" ADD COLUMN "file_id" text;--> statement-breakpoint
CREATE INDEX "requests_state_idx" ON "requests" USING btree ("state");--> statement-breakpoint
CREATE INDEX "requests_ended_idx" ON "requests" USING btree ("ended_at");