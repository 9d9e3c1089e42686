"""The shard formats the gateway reads and writes, each in one module named after it."""
