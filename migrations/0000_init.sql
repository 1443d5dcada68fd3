CREATE TYPE "public"."chunk_state" AS ENUM('writing', 'ready', 'reading', 'released', 'failed');--> statement-breakpoint
CREATE TYPE "public"."instance_role" AS ENUM('prefill', 'decode');--> statement-breakpoint
CREATE TYPE "public"."instance_state" AS ENUM('alive', 'draining', 'dead');--> statement-breakpoint
CREATE TYPE "public"."kv_dtype" AS ENUM('f32', 'f16');--> statement-breakpoint
CREATE TYPE "public"."request_state" AS ENUM('queued', 'prefilling', 'decoding', 'done', 'failed', 'cancelled');--> statement-breakpoint
CREATE TYPE "public"."shard_state" AS ENUM('active', 'retired');--> statement-breakpoint
CREATE TABLE "chunk_refs" (
	"chunk_id" uuid NOT NULL,
	"request_id" text NOT NULL,
	CONSTRAINT "chunk_refs_chunk_id_request_id_pk" PRIMARY KEY("chunk_id","request_id")
);
--> statement-breakpoint
CREATE TABLE "chunks" (
	"id" uuid PRIMARY KEY DEFAULT gen_random_uuid() NOT NULL,
	"key" text NOT NULL,
	"request_id" text NOT NULL,
	"session_id" text,
	"round_id" integer,
	"layer_group" integer NOT NULL,
	"layer_ids" integer[] NOT NULL,
	"token_start" integer NOT NULL,
	"token_end" integer NOT NULL,
	"shard_id" text NOT NULL,
	"shard_epoch" integer NOT NULL,
	"offset" bigint NOT NULL,
	"length" bigint NOT NULL,
	"dtype" "kv_dtype" NOT NULL,
	"layout_version" smallint NOT NULL,
	"model_fingerprint" text NOT NULL,
	"checksum" bigint,
	"state" "chunk_state" DEFAULT 'writing' NOT NULL,
	"lease_expires_at" timestamp with time zone NOT NULL,
	"reader_count" integer DEFAULT 0 NOT NULL,
	"ref_count" integer DEFAULT 0 NOT NULL,
	"created_at" timestamp with time zone NOT NULL,
	"updated_at" timestamp with time zone NOT NULL,
	CONSTRAINT "chunks_token_range" CHECK ("chunks"."token_start" >= 0 and "chunks"."token_end" > "chunks"."token_start"),
	CONSTRAINT "chunks_range" CHECK ("chunks"."offset" >= 0 and "chunks"."length" > 0),
	CONSTRAINT "chunks_fingerprint_hex" CHECK ("chunks"."model_fingerprint" ~ '^[0-9a-f]{64}$'),
	CONSTRAINT "chunks_ref_count" CHECK ("chunks"."ref_count" >= 0),
	CONSTRAINT "chunks_held_while_live" CHECK ("chunks"."state" not in ('writing', 'ready') or "chunks"."ref_count" > 0),
	CONSTRAINT "chunks_readers_match_state" CHECK (("chunks"."state" = 'reading') = ("chunks"."reader_count" > 0))
);
--> statement-breakpoint
CREATE TABLE "instances" (
	"id" text PRIMARY KEY NOT NULL,
	"role" "instance_role" NOT NULL,
	"base_url" text NOT NULL,
	"host_id" text NOT NULL,
	"started_at" timestamp with time zone NOT NULL,
	"last_heartbeat_at" timestamp with time zone NOT NULL,
	"state" "instance_state" DEFAULT 'alive' NOT NULL
);
--> statement-breakpoint
CREATE TABLE "requests" (
	"id" text PRIMARY KEY NOT NULL,
	"session_id" text,
	"round_id" integer,
	"state" "request_state" DEFAULT 'queued' NOT NULL,
	"arrival_at" timestamp with time zone NOT NULL,
	"prefill_start_at" timestamp with time zone,
	"prefill_end_at" timestamp with time zone,
	"first_token_at" timestamp with time zone,
	"last_token_at" timestamp with time zone,
	"prompt_tokens" integer,
	"output_tokens" integer DEFAULT 0 NOT NULL,
	"error" text
);
--> statement-breakpoint
CREATE TABLE "shards" (
	"id" text NOT NULL,
	"epoch" integer NOT NULL,
	"instance_id" text NOT NULL,
	"path" text NOT NULL,
	"size_bytes" bigint NOT NULL,
	"state" "shard_state" DEFAULT 'active' NOT NULL,
	"created_at" timestamp with time zone NOT NULL,
	CONSTRAINT "shards_id_epoch_pk" PRIMARY KEY("id","epoch"),
	CONSTRAINT "shards_epoch_positive" CHECK ("shards"."epoch" > 0),
	CONSTRAINT "shards_size_positive" CHECK ("shards"."size_bytes" > 0)
);
--> statement-breakpoint
ALTER TABLE "chunk_refs" ADD CONSTRAINT "chunk_refs_chunk_id_chunks_id_fk" FOREIGN KEY ("chunk_id") REFERENCES "public"."chunks"("id") ON DELETE cascade ON UPDATE no action;--> statement-breakpoint
ALTER TABLE "chunks" ADD CONSTRAINT "chunks_shard_id_shard_epoch_shards_id_epoch_fk" FOREIGN KEY ("shard_id","shard_epoch") REFERENCES "public"."shards"("id","epoch") ON DELETE cascade ON UPDATE no action;--> statement-breakpoint
ALTER TABLE "shards" ADD CONSTRAINT "shards_instance_id_instances_id_fk" FOREIGN KEY ("instance_id") REFERENCES "public"."instances"("id") ON DELETE no action ON UPDATE no action;--> statement-breakpoint
CREATE INDEX "chunk_refs_request_idx" ON "chunk_refs" USING btree ("request_id");--> statement-breakpoint
CREATE UNIQUE INDEX "chunks_live_key_idx" ON "chunks" USING btree ("key") WHERE "chunks"."state" in ('writing', 'ready', 'reading');--> statement-breakpoint
CREATE INDEX "chunks_request_idx" ON "chunks" USING btree ("request_id");--> statement-breakpoint
CREATE INDEX "chunks_shard_state_idx" ON "chunks" USING btree ("shard_id","shard_epoch","state");--> statement-breakpoint
CREATE INDEX "instances_role_state_idx" ON "instances" USING btree ("role","state","last_heartbeat_at");--> statement-breakpoint
CREATE INDEX "requests_session_idx" ON "requests" USING btree ("session_id");--> statement-breakpoint
CREATE INDEX "shards_instance_idx" ON "shards" USING btree ("instance_id");