"""``keyshift run`` (``keyshift.controller.local``) and the CLI, as a user runs them."""
