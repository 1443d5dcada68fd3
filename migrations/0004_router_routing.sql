ALTER TYPE "public"."instance_role" ADD VALUE 'router';--> statement-breakpoint
ALTER TABLE "instances" ADD COLUMN "public_url" text;--> statement-breakpoint
ALTER TABLE "sessions" ADD COLUMN "message_hashes" jsonb DEFAULT '[]'::jsonb NOT NULL;--> statement-breakpoint
CREATE INDEX "sessions_message_hashes_idx" ON "sessions" USING gin ("message_hashes");