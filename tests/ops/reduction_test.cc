// Tests for the reduction ops (being written).
#include <gtest/gtest.h>
