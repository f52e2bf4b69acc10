#pragma once
// Everything public in wick.

#include "wick/autograd.h"
#include "wick/cuda.h"
#include "wick/device.h"
#include "wick/dtype.h"
#include "wick/error.h"
#include "wick/half.h"
#include "wick/layout.h"
#include "wick/nn.h"
#include "wick/numerics.h"
#include "wick/optim.h"
#include "wick/shape.h"
#include "wick/tensor.h"
