"""The operator's pure parts and the CRD (``keyshift.controller.kubernetes``)."""
