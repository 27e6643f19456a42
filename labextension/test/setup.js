// jsdom has no DragEvent, which @lumino/dragdrop subclasses at import time (JupyterLab's own
// jest setup, @jupyterlab/testutils, fills the same gap).
if (typeof globalThis.DragEvent === 'undefined') {
  globalThis.DragEvent = class DragEvent extends MouseEvent {};
}
