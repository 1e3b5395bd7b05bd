#pragma once
// The four broadcasting binary ops and their partial derivatives, shared by CPU and CUDA code.
#include "tensor/hd.h"

namespace cast {

enum class BinaryOp : int { add, sub, mul, div };

template <class T>
CAST_HD T binary_apply(BinaryOp op, T a, T b) {
  switch (op) {
    case BinaryOp::add: return a + b;
    case BinaryOp::sub: return a - b;
    case BinaryOp::mul: return a * b;
    default: return a / b;
  }
}
// d(a op b)/da
template <class T>
CAST_HD T binary_da(BinaryOp op, T, T b) {
  switch (op) {
    case BinaryOp::add:
    case BinaryOp::sub: return T(1);
    case BinaryOp::mul: return b;
    default: return T(1) / b;
  }
}
// d(a op b)/db
template <class T>
CAST_HD T binary_db(BinaryOp op, T a, T b) {
  switch (op) {
    case BinaryOp::add: return T(1);
    case BinaryOp::sub: return T(-1);
    case BinaryOp::mul: return a;
    default: return -a / (b * b);
  }
}

}  // namespace cast
