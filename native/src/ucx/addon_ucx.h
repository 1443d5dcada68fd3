// N-API bindings of the UCX transport (native/src/ucx/ucx_node.h); see addon_ucx.cc.
#pragma once
#include <napi.h>

namespace ctx {

// Adds ucxAvailable (and, in a UCX build, the ucx* functions) to `exports`.
void init_ucx(Napi::Env env, Napi::Object exports);

}  // namespace ctx
