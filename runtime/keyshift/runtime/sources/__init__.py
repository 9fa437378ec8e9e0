"""Sources: where a worker's records come from, per key group and offset."""
