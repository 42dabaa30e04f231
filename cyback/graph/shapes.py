"""Static shapes as error messages print them."""


def format_shape(shape):
    """``(2, None, 3)``: a static shape with None for sizes known only at run
    time; a 1-tuple keeps its comma, ``(3,)``, as Python prints it."""
    shape = tuple(shape)
    return "(%s%s)" % (", ".join("None" if d is None else str(d) for d in shape),
                       "," if len(shape) == 1 else "")
