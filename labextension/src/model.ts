/**
 * What the sidebar knows: the rows the server pushes, and pure helpers that format them.
 * No DOM and no JupyterLab import here, so `jest` tests every rule on its own.
 */

export interface ITaskRow {
  name: string;
  phase: string;
  reason: string;
  restarts: number;
  exit_code: number | null;
}

export interface IProgressRow {
  step: number;
  total: number | null;
  percent: number | null;
  eta: number | null;
  rate: number | null;
  metrics: { [key: string]: number };
  time: number;
}

export interface IClusterRow {
  name: string;
  backend: string;
  mode: string;
  phase: string;
  terminal: boolean;
  reason: string;
  stall: string;
  created: number;
  finished: number | null;
  detached: boolean;
  owner: string;
  log_dir: string;
  ready: number;
  total: number;
  tasks: ITaskRow[];
  failed_task: string | null;
  progress: IProgressRow | null;
}

export type StreamMessage =
  | { type: 'snapshot'; backend: string; error: string; clusters: IClusterRow[] }
  | { type: 'cluster'; cluster: IClusterRow }
  | { type: 'removed'; name: string }
  | { type: 'error'; message: string; id?: string }
  | { type: 'logs'; id: string; lines: [string, string, number][] }
  | { type: 'logs_end'; id: string };

/** The rows by name, plus the backend and the server's last error. */
export interface IState {
  backend: string;
  error: string;
  clusters: Map<string, IClusterRow>;
}

export function emptyState(): IState {
  return { backend: '', error: '', clusters: new Map() };
}

/**
 * The state after one message from the server.  A snapshot replaces everything (after a
 * reconnect the server's view wins: a cluster deleted meanwhile is gone).
 */
export function applyMessage(state: IState, msg: StreamMessage): IState {
  switch (msg.type) {
    case 'snapshot':
      return {
        backend: msg.backend,
        error: msg.error,
        clusters: new Map(msg.clusters.map(c => [c.name, c]))
      };
    case 'cluster': {
      const clusters = new Map(state.clusters);
      clusters.set(msg.cluster.name, msg.cluster);
      return { ...state, clusters };
    }
    case 'removed': {
      if (!state.clusters.has(msg.name)) {
        return state;
      }
      const clusters = new Map(state.clusters);
      clusters.delete(msg.name);
      return { ...state, clusters };
    }
    case 'error':
      return msg.id === undefined ? { ...state, error: msg.message } : state;
    default:
      return state;
  }
}

/** Rows newest first (the order of `tfk8s list`), name as the tie-break so the order is stable. */
export function sortedRows(state: IState): IClusterRow[] {
  return [...state.clusters.values()].sort(
    (a, b) => b.created - a.created || a.name.localeCompare(b.name)
  );
}

/** `75` -> `1m15s`, `3700` -> `1h01m`; null -> `-` (the magic's own format). */
export function fmtDuration(seconds: number | null | undefined): string {
  if (seconds === null || seconds === undefined || !isFinite(seconds)) {
    return '-';
  }
  const s = Math.round(seconds);
  const h = Math.floor(s / 3600);
  const m = Math.floor((s % 3600) / 60);
  const r = s % 60;
  if (h) {
    return `${h}h${String(m).padStart(2, '0')}m`;
  }
  if (m) {
    return `${m}m${String(r).padStart(2, '0')}s`;
  }
  return `${r}s`;
}

/** `step 120/1000 · ETA 1m05s`, or `` with no progress reported. */
export function progressText(row: IClusterRow): string {
  const p = row.progress;
  if (!p) {
    return '';
  }
  let text = `step ${p.step}` + (p.total ? `/${p.total}` : '');
  if (p.eta !== null && !row.terminal) {
    text += ` · ETA ${fmtDuration(p.eta)}`;
  }
  return text;
}

/** The bar's fill, 0 to 100: the reported percent, or 100 once succeeded, else 0. */
export function progressPercent(row: IClusterRow): number {
  if (row.phase === 'succeeded') {
    return 100;
  }
  const pct = row.progress?.percent;
  return pct === null || pct === undefined ? 0 : Math.max(0, Math.min(100, pct));
}

/** Why a cluster is as it is: its stall sentence, else its reason, else the first failed task's. */
export function reasonText(row: IClusterRow): string {
  if (row.stall) {
    return row.stall;
  }
  if (row.reason) {
    return row.reason;
  }
  const failed = row.tasks.find(t => t.phase === 'failed' && t.reason);
  return failed ? `${failed.name}: ${failed.reason}` : '';
}

/** The task a logs view selects first: the first failed task, else the first task. */
export function firstTask(row: IClusterRow): string | null {
  return row.failed_task ?? (row.tasks.length ? row.tasks[0].name : null);
}

/** A cluster name as a Python string literal (names are DNS labels; quoted anyway). */
function pyString(name: string): string {
  return "'" + name.replace(/\\/g, '\\\\').replace(/'/g, "\\'") + "'";
}

/**
 * The cell that connects a notebook to a cluster: in-graph makes the kernel its client
 * (`strategy = %tfcluster connect NAME`); any other gives the Python handle.
 */
export function connectCode(row: Pick<IClusterRow, 'name' | 'mode'>): string {
  if (row.mode === 'in-graph') {
    return `strategy = %tfcluster connect ${row.name}`;
  }
  return `import tfk8s_magics as tk\ncluster = tk.get(${pyString(row.name)})\ncluster`;
}

/** The loss (or the first metric) of a progress report, for the curve. */
export function lossOf(p: IProgressRow | null): number | null {
  if (!p) {
    return null;
  }
  if (typeof p.metrics.loss === 'number') {
    return p.metrics.loss;
  }
  const keys = Object.keys(p.metrics).sort();
  return keys.length ? p.metrics[keys[0]] : null;
}

/** Points of a curve: a new (step, value) is added when the step moved on; at most `max` kept. */
export function addPoint(
  points: [number, number][],
  step: number,
  value: number | null,
  max = 2000
): [number, number][] {
  if (value === null || !isFinite(value)) {
    return points;
  }
  const last = points[points.length - 1];
  if (last && last[0] === step) {
    return points;
  }
  const out = last && step < last[0] ? [] : points.slice(); // a restarted run starts a new curve
  out.push([step, value]);
  return out.length > max ? out.slice(out.length - max) : out;
}

/** An SVG polyline's `points` for `points` scaled into a width x height box (y grows down). */
export function polyline(points: [number, number][], width: number, height: number): string {
  if (!points.length) {
    return '';
  }
  const xs = points.map(p => p[0]);
  const ys = points.map(p => p[1]);
  const [x0, x1] = [Math.min(...xs), Math.max(...xs)];
  const [y0, y1] = [Math.min(...ys), Math.max(...ys)];
  const sx = x1 > x0 ? width / (x1 - x0) : 0;
  const sy = y1 > y0 ? height / (y1 - y0) : 0;
  return points
    .map(([x, y]) => `${((x - x0) * sx).toFixed(1)},${(height - (y - y0) * sy).toFixed(1)}`)
    .join(' ');
}

/** The JSON body of the launch form from its raw inputs (empty text left out: the default). */
export interface IField {
  name: string;
  flag: string;
  kind: 'int' | 'float' | 'bool' | 'list' | 'text';
  default: string | number | boolean | null;
  help: string;
  metavar: string;
}

export function formValues(
  fields: IField[],
  raw: { [name: string]: string | boolean }
): { [name: string]: string | boolean | string[] } {
  const out: { [name: string]: string | boolean | string[] } = {};
  for (const f of fields) {
    const v = raw[f.name];
    if (v === undefined) {
      continue;
    }
    if (f.kind === 'bool') {
      if (v !== (f.default === true)) {
        out[f.name] = Boolean(v);
      }
    } else if (f.kind === 'list') {
      const items = String(v)
        .split('\n')
        .map(s => s.trim())
        .filter(s => s);
      if (items.length) {
        out[f.name] = items;
      }
    } else if (String(v).trim() !== '' && String(v).trim() !== String(f.default ?? '')) {
      out[f.name] = String(v).trim();
    }
  }
  return out;
}

/** `train/mnist_v2.py` -> `mnist-v2`: a DNS label from a script's name. */
export function suggestName(path: string): string {
  const base = (path.split('/').pop() ?? '').replace(/\.py$/, '');
  return base
    .toLowerCase()
    .replace(/[^a-z0-9-]+/g, '-')
    .replace(/^-+|-+$/g, '')
    .slice(0, 40);
}
