// Entry of a tokenizer thread: worker threads do not inherit tsx's loader, so register it here,
// then load the TypeScript worker.
import { register } from "tsx/esm/api";

register();
const worker = await import("./tokenizer-worker.ts");
export default worker.default;
