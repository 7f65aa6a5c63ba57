// Tests for the matmul ops (being written).
#include <gtest/gtest.h>
