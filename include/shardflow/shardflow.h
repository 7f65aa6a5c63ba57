// The public API of shardflow, in one include.
#pragma once

#include "shardflow/base/error.h"
#include "shardflow/base/python_literal.h"
#include "shardflow/ir/graph.h"
#include "shardflow/ir/text.h"
#include "shardflow/ops/ops.h"
#include "shardflow/sharding/hlo_sharding.h"
#include "shardflow/sharding/mesh.h"
#include "shardflow/sharding/partition_spec.h"
#include "shardflow/sharding/shard_diagram.h"
#include "shardflow/sharding/shard_layout.h"
#include "shardflow/sharding/sharding.h"
#include "shardflow/trace/call.h"
#include "shardflow/trace/compile.h"
#include "shardflow/trace/mark_sharding.h"
#include "shardflow/trace/ops.h"
#include "shardflow/trace/tensor.h"
