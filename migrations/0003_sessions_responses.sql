CREATE TYPE "public"."session_tier" AS ENUM('memory', 'disk');--> statement-breakpoint
CREATE TABLE "responses" (
	"id" text PRIMARY KEY NOT NULL,
	"tenant" text NOT NULL,
	"previous_id" text,
	"session_id" text NOT NULL,
	"model" text NOT NULL,
	"input" jsonb NOT NULL,
	"output_text" text NOT NULL,
	"input_tokens" integer NOT NULL,
	"output_tokens" integer NOT NULL,
	"created_at" timestamp with time zone NOT NULL,
	"expires_at" timestamp with time zone NOT NULL
);
--> statement-breakpoint
CREATE TABLE "sessions" (
	"id" text PRIMARY KEY NOT NULL,
	"tenant" text NOT NULL,
	"holder_instance_id" text NOT NULL,
	"tier" "session_tier" NOT NULL,
	"tokens" integer NOT NULL,
	"bytes" bigint NOT NULL,
	"round_hashes" jsonb NOT NULL,
	"turns" integer NOT NULL,
	"created_at" timestamp with time zone NOT NULL,
	"last_used_at" timestamp with time zone NOT NULL,
	"expires_at" timestamp with time zone NOT NULL,
	CONSTRAINT "sessions_sizes" CHECK ("sessions"."tokens" >= 0 and "sessions"."bytes" >= 0 and "sessions"."turns" >= 1)
);
--> statement-breakpoint
CREATE INDEX "responses_tenant_idx" ON "responses" USING btree ("tenant");--> statement-breakpoint
CREATE INDEX "responses_expires_idx" ON "responses" USING btree ("expires_at");--> statement-breakpoint
CREATE INDEX "sessions_holder_idx" ON "sessions" USING btree ("holder_instance_id");--> statement-breakpoint
CREATE INDEX "sessions_tenant_idx" ON "sessions" USING btree ("tenant");--> statement-breakpoint
CREATE INDEX "sessions_expires_idx" ON "sessions" USING btree ("expires_at");