/** How the client reconnects. The delay before attempt n (counting from 0) is
 *
 *     min(baseDelayMs * factor^n, maxDelayMs) * (1 ± jitter)
 *
 * and n returns to 0 once a connection stayed healthy for resetAfterMs. */
export interface ReconnectPolicy {
  /** First delay (default 100 ms). */
  baseDelayMs: number;
  /** Growth per failed attempt (default 2). */
  factor: number;
  /** Largest delay (default 30 000 ms). */
  maxDelayMs: number;
  /** Fraction of the delay added or removed at random (default 0.1). */
  jitter: number;
  /** A connection healthy this long resets the attempt count (default 10 000 ms). */
  resetAfterMs: number;
  /** Failed attempts in a row before giving up; 0 = never give up (default). */
  maxAttempts: number;
}

/** The defaults of ReconnectPolicy, the same as the Go SDK's. */
export const RECONNECT_DEFAULTS: Readonly<ReconnectPolicy> = Object.freeze({
  baseDelayMs: 100,
  factor: 2,
  maxDelayMs: 30_000,
  jitter: 0.1,
  resetAfterMs: 10_000,
  maxAttempts: 0,
});

/** Fills the unset or invalid fields of p with the defaults. */
export function reconnectPolicy(p: Partial<ReconnectPolicy> = {}): ReconnectPolicy {
  const d = RECONNECT_DEFAULTS;
  return {
    baseDelayMs: p.baseDelayMs && p.baseDelayMs > 0 ? p.baseDelayMs : d.baseDelayMs,
    factor: p.factor && p.factor >= 1 ? p.factor : d.factor,
    maxDelayMs: p.maxDelayMs && p.maxDelayMs > 0 ? p.maxDelayMs : d.maxDelayMs,
    jitter: p.jitter && p.jitter > 0 ? Math.min(p.jitter, 1) : d.jitter,
    resetAfterMs: p.resetAfterMs && p.resetAfterMs > 0 ? p.resetAfterMs : d.resetAfterMs,
    maxAttempts: p.maxAttempts && p.maxAttempts > 0 ? Math.floor(p.maxAttempts) : 0,
  };
}

/** The wait in milliseconds before reconnect attempt n (0-based), given r, a
 * uniform random number in [0, 1) that places the jitter. */
export function backoffDelay(policy: Partial<ReconnectPolicy>, n: number, r: number): number {
  const p = reconnectPolicy(policy);
  let d = p.baseDelayMs;
  for (let i = 0; i < n && d < p.maxDelayMs; i++) d *= p.factor;
  d = Math.min(d, p.maxDelayMs);
  return d * (1 + p.jitter * (2 * r - 1));
}
