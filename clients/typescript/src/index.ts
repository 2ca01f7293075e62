/**
 * fairway's TypeScript client: the HTTP API ({@link FairwayClient}, {@link RegionalClient}),
 * typed errors, and the Avro codec. Kafka readers are in `@fairway/client/kafka`, the job
 * handler helper in `@fairway/client/handler`.
 */
export * from "./errors.js";
export * from "./types.js";
export { FairwayClient, DEFAULT_RETRY } from "./http.js";
export type { RetryPolicy, ClientOptions, CallOptions, EventsOptions } from "./http.js";
export { RegionalClient, FAILOVER_HEADER } from "./regions.js";
export type { RegionalOptions } from "./regions.js";
export { parseSse } from "./sse.js";
export type { SseMessage } from "./sse.js";
export { encode, decode, rabin, schemaVersions, currentFingerprint, KINDS } from "./avro.js";
export type { Kind } from "./avro.js";
