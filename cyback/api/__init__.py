"""The Keras backend API (``import cyback as K`` re-exports these modules).

Each function checks its arguments against Keras's conventions, raising
errors that name it, and builds the graph from ops (``cyback.ops``). Top
layer of the library: it may import ops, graph and config; nothing below
imports it.
"""
