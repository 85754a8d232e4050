"""PySpark analysis of kproxy client histories and wire traces.

Every transformation here is a pure ``DataFrame -> DataFrame`` function; the
job entry points only wire input and output.
"""
