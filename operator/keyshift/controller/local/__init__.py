"""``keyshift run``: the local job runner, its worker processes and the live view."""
