// Tests for the creation ops (being written).
#include <gtest/gtest.h>
