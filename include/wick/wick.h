#pragma once
// Everything public in wick: every header under include/wick (the consumer test checks that this
// file reaches each of them).

#include "wick/autograd.h"
#include "wick/cpu.h"
#include "wick/cuda.h"
#include "wick/custom_op.h"
#include "wick/device.h"
#include "wick/dtype.h"
#include "wick/error.h"
#include "wick/formats.h"
#include "wick/half.h"
#include "wick/layout.h"
#include "wick/loss.h"
#include "wick/models.h"
#include "wick/nn.h"
#include "wick/nn/decoder_ops.h"
#include "wick/numerics.h"
#include "wick/optim.h"
#include "wick/shape.h"
#include "wick/tensor.h"
