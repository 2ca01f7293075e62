/**
 * Typed errors. Every error answer of the API is `{error, code}` (openapi/openapi.json,
 * `ErrorCode`); {@link FairwayError} carries that code, the HTTP status and the
 * `Retry-After` wait the server asked for.
 */

/** The codes the API answers with (the `ErrorCode` enum of the OpenAPI description). */
export type ErrorCode =
  | "INVALID_JSON" | "INVALID_JOB" | "UNKNOWN_TENANT" | "UNKNOWN_JOB_TYPE" | "PAYLOAD_TOO_LARGE"
  | "BODY_TOO_LARGE" | "NEVER_RUNNABLE" | "TIME_OUT_OF_RANGE" | "BAD_TRACE_CONTEXT" | "BAD_FLOW_KEY"
  | "BAD_USER_KEY" | "WEBHOOK_SECRET_MISSING" | "EMPTY_BATCH" | "BATCH_TOO_LARGE" | "BATCH_EXCEEDS_BURST"
  | "TENANT_RATE_LIMIT_EXCEEDED" | "USER_RATE_LIMIT_EXCEEDED" | "TOO_MANY_DEBOUNCE_WINDOWS"
  | "TENANT_QUEUE_FULL" | "CIRCUIT_OPEN" | "JOB_NOT_FOUND" | "INVALID_QUERY" | "INVALID_JOB_ID"
  | "JOB_ALREADY_FINISHED" | "NO_SUCH_ROUTE" | "METHOD_NOT_ALLOWED" | "METRICS_DISABLED"
  | "KAFKA_UNAVAILABLE" | "STORE_UNAVAILABLE" | "PARTIAL_SUBMIT" | "INTERNAL" | "UNAUTHENTICATED"
  | "FORBIDDEN" | "INVALID_TENANT" | "TENANT_EXISTS" | "TOO_MANY_SESSIONS" | "REPLAY_FAILED"
  | "JOB_TYPE_NOT_ALLOWED" | "SCHEDULE_TOO_FAR_AHEAD" | "TOO_MANY_SUBMISSIONS" | "TOO_MANY_STREAMS"
  | "TOO_MANY_SCANS" | "BODY_TIMEOUT" | "TOO_MANY_REQUESTS" | "TOO_MANY_REQUESTS_WITH_BODIES"
  | "MISDIRECTED_REGION" | "REGION_UNAVAILABLE" | "INVALID_SCHEDULE" | "SCHEDULE_EXISTS"
  | "UNKNOWN_SCHEDULE" | "TOO_MANY_SCHEDULES";

/** Codes of this client's own (not the server's). */
export type ClientCode = "HTTP_ERROR" | "REDIRECT_REFUSED" | "NO_REGION";

/** An error answer of the API. */
export class FairwayError extends Error {
  override readonly name: string = "FairwayError";
  constructor(
    /** HTTP status. */
    readonly status: number,
    /** fairway's stable code (or HTTP_ERROR when the body was not fairway's JSON). */
    readonly code: ErrorCode | ClientCode | (string & {}),
    /** What is wrong and how to fix it (the server's `error`). */
    readonly detail: string,
    /** Seconds from `Retry-After` (429, 503), if the server sent it. */
    readonly retryAfter?: number,
    /** The whole error body (e.g. `results` of PARTIAL_SUBMIT, `home_region` of a 421). */
    readonly body?: Record<string, unknown>,
  ) {
    super(`HTTP ${status} ${code}: ${detail}`);
  }
}

/**
 * The server answered a redirect; the client does not follow it (it would carry the API
 * key somewhere the caller did not name). fairway never redirects: check the base URL.
 */
export class RedirectRefusedError extends FairwayError {
  override readonly name = "RedirectRefusedError";
  constructor(status: number, readonly location: string | null, readonly url: string) {
    super(
      status,
      "REDIRECT_REFUSED",
      `${url} redirected to ${location ?? "(no Location header)"}; the client does not follow redirects (they ` +
        "could carry the API key to another host): if that is the API, use it as the base URL",
    );
  }
}

/** No response came (connection refused, reset, timed out); `sent` says whether the request may have reached the server. */
export class TransportError extends Error {
  override readonly name = "TransportError";
  constructor(message: string, readonly sent: boolean, override readonly cause?: unknown) {
    super(message);
  }
}

/** A Kafka message that is not a fairway record of the expected kind. */
export class DecodeError extends Error {
  override readonly name = "DecodeError";
}
