"""`rvqlm demo`: the pipeline (pipeline.py) and the sections of its listening report (report.py)."""
