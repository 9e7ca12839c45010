"""Image bytes to RGB pixels: one room for every decoder hasten uses.

``image.decode`` is the entry (whole, at a DCT scale, or one region); ``header`` reads
an image's header once; behind them ``turbojpeg`` (libjpeg-turbo 3's partial decode,
by ctypes) and ``backends`` (simplejpeg and Pillow). Import from the submodules.
"""
