// Tests for the index ops (being written).
#include <gtest/gtest.h>
