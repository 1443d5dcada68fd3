// The error a policy that cannot run raises; the services answer it with 400 invalid_policy.
import { CtxbankError } from "../errors.ts";

/** The policy cannot run on this model (code invalid_policy; param: the field at fault, e.g. "policy.omnikv.budget"). */
export class PolicyError extends CtxbankError<"invalid_policy"> {
  static override readonly codes = ["invalid_policy"] as const;
  override readonly name = "PolicyError";
  constructor(message: string, param = "policy") {
    super("invalid_policy", message, { param });
  }
}
