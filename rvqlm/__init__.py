"""rvqlm: the command-line application and the small utilities shared by `codec` and `lm`.

Importing this package imports neither `codec` nor `lm`; the two libraries stay independent.
"""

__version__ = "0.1.0"
