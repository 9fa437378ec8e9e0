"""The StreamJob API: its model (``spec``) and its names (``names``), one definition
shared by ``keyshift run``, the operator, the CRD and the workers."""
