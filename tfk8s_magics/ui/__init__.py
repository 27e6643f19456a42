"""What the notebook shows: status tables, live log views, TensorBoard.

Everything built from names, log lines or error messages is escaped: it
is shown as text, never interpreted as HTML.
"""
