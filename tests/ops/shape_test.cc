// Tests for the shape ops (being written).
#include <gtest/gtest.h>
