#pragma once
// wick::nn: named weights, layers and attention. The fused ops themselves (softmax_last_dim,
// layer_norm, rms_norm, rope, rope_interleaved) are Tensor methods (wick/tensor.h).

#include "wick/nn/attention.h"
#include "wick/nn/layers.h"
#include "wick/nn/weights.h"
#include "wick/tensor.h"
