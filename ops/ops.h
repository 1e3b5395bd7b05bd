#pragma once
// Every op of the engine. Each header declares an op's forward/backward pair and the
// autograd-recording function that composes models.
#include "ops/convert.h"
#include "ops/dropout.h"
#include "ops/elementwise.h"
#include "ops/layernorm.h"
#include "ops/layout.h"
#include "ops/linear.h"
#include "ops/mlp.h"
#include "ops/loss.h"
#include "ops/matmul.h"
#include "ops/pooling.h"
#include "ops/reduce.h"
#include "ops/rows.h"
#include "ops/softmax.h"
#include "ops/topk.h"
#include "ops/unary.h"
