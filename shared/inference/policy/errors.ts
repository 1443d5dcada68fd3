// The error a policy that cannot run raises; the services answer it with 400 invalid_policy.
export class PolicyError extends Error {
  override readonly name = "PolicyError";
  /** The field at fault (e.g. "policy.omnikv.budget"), when one is. */
  constructor(
    message: string,
    readonly param = "policy",
  ) {
    super(message);
  }
}
