// The distillation calls for f32 inputs (one dtype per translation unit: they compile in parallel).
#include "dtype_calls.hpp"

namespace tlse::capi {
TLSE_CAPI_DISTILLATION(float);
}
