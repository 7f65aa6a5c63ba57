// The public API of shardflow, in one include.
#pragma once

#include "shardflow/base/error.h"
#include "shardflow/base/python_literal.h"
#include "shardflow/sharding/hlo_sharding.h"
#include "shardflow/sharding/mesh.h"
#include "shardflow/sharding/partition_spec.h"
#include "shardflow/sharding/shard_diagram.h"
#include "shardflow/sharding/shard_layout.h"
#include "shardflow/sharding/sharding.h"
