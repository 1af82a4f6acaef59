"""The codec core: the codec interface (interface.py) and rvqlm's own codec (model, config, parts registry,
quantizer, int8), its streaming, its folder and `.rvq` formats, and audio I/O. The other rooms build on it."""
