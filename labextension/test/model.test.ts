import {
  addPoint,
  applyMessage,
  connectCode,
  emptyState,
  firstTask,
  fmtDuration,
  formValues,
  IClusterRow,
  IField,
  lossOf,
  polyline,
  progressPercent,
  progressText,
  reasonText,
  sortedRows,
  suggestName
} from '../src/model';

function row(over: Partial<IClusterRow> = {}): IClusterRow {
  return {
    name: 'mnist',
    backend: 'local',
    mode: 'between',
    phase: 'running',
    terminal: false,
    reason: '',
    stall: '',
    created: 100,
    finished: null,
    detached: true,
    owner: 'demo',
    log_dir: '/tmp/x',
    ready: 2,
    total: 3,
    tasks: [
      { name: 'ps-0', phase: 'running', reason: '', restarts: 0, exit_code: null },
      { name: 'worker-0', phase: 'running', reason: '', restarts: 0, exit_code: null },
      { name: 'worker-1', phase: 'starting', reason: '', restarts: 0, exit_code: null }
    ],
    failed_task: null,
    progress: null,
    ...over
  };
}

describe('applyMessage', () => {
  it('replaces everything with a snapshot, so a cluster deleted while offline is gone', () => {
    let s = applyMessage(emptyState(), {
      type: 'snapshot',
      backend: 'local',
      error: '',
      clusters: [row({ name: 'a' }), row({ name: 'b' })]
    });
    expect([...s.clusters.keys()]).toEqual(['a', 'b']);
    s = applyMessage(s, { type: 'snapshot', backend: 'local', error: '', clusters: [row({ name: 'b' })] });
    expect([...s.clusters.keys()]).toEqual(['b']);
  });

  it('updates one row and removes one, leaving the others as they were', () => {
    const a = row({ name: 'a' });
    let s = applyMessage(emptyState(), { type: 'snapshot', backend: 'local', error: '', clusters: [a, row({ name: 'b' })] });
    s = applyMessage(s, { type: 'cluster', cluster: row({ name: 'b', phase: 'succeeded' }) });
    expect(s.clusters.get('b')!.phase).toBe('succeeded');
    expect(s.clusters.get('a')).toBe(a);
    s = applyMessage(s, { type: 'removed', name: 'b' });
    expect([...s.clusters.keys()]).toEqual(['a']);
  });

  it('returns the same state when nothing changed, so no redraw happens', () => {
    const s = emptyState();
    expect(applyMessage(s, { type: 'removed', name: 'nope' })).toBe(s);
    expect(applyMessage(s, { type: 'logs_end', id: '1' })).toBe(s);
    expect(applyMessage(s, { type: 'error', id: '1', message: 'x' })).toBe(s);
    expect(applyMessage(s, { type: 'error', message: 'cannot list' }).error).toBe('cannot list');
  });
});

describe('formatting', () => {
  it('formats durations as the magic does', () => {
    expect(fmtDuration(null)).toBe('-');
    expect(fmtDuration(5)).toBe('5s');
    expect(fmtDuration(75)).toBe('1m15s');
    expect(fmtDuration(3700)).toBe('1h01m');
  });

  it('shows step/total and the ETA only while running', () => {
    const p = { step: 120, total: 1000, percent: 12, eta: 65, rate: 5, metrics: {}, time: 0 };
    expect(progressText(row({ progress: p }))).toBe('step 120/1000 · ETA 1m05s');
    expect(progressText(row({ progress: p, terminal: true }))).toBe('step 120/1000');
    expect(progressText(row())).toBe('');
    expect(progressPercent(row({ progress: p }))).toBe(12);
    expect(progressPercent(row({ phase: 'succeeded' }))).toBe(100);
    expect(progressPercent(row({ progress: { ...p, percent: null } }))).toBe(0);
  });

  it('gives the stall first, then the reason, then the failed task', () => {
    const failed = row({
      tasks: [{ name: 'worker-1', phase: 'failed', reason: 'exit code 1', restarts: 2, exit_code: 1 }]
    });
    expect(reasonText(failed)).toBe('worker-1: exit code 1');
    expect(reasonText({ ...failed, reason: 'restart budget spent' })).toBe('restart budget spent');
    expect(reasonText({ ...failed, reason: 'x', stall: 'stalled: no log line for 5m00s' })).toBe(
      'stalled: no log line for 5m00s'
    );
  });

  it('sorts newest first, by name on a tie', () => {
    let s = emptyState();
    s = applyMessage(s, {
      type: 'snapshot',
      backend: 'local',
      error: '',
      clusters: [row({ name: 'old', created: 1 }), row({ name: 'b', created: 5 }), row({ name: 'a', created: 5 })]
    });
    expect(sortedRows(s).map(r => r.name)).toEqual(['a', 'b', 'old']);
  });
});

describe('views', () => {
  it('selects the first failed task first, else the first task', () => {
    expect(firstTask(row())).toBe('ps-0');
    expect(firstTask(row({ failed_task: 'worker-1' }))).toBe('worker-1');
    expect(firstTask(row({ tasks: [] }))).toBeNull();
  });

  it('inserts %tfcluster connect for in-graph and tk.get for the others', () => {
    expect(connectCode({ name: 'ig', mode: 'in-graph' })).toBe('strategy = %tfcluster connect ig');
    expect(connectCode({ name: 'mnist', mode: 'between' })).toBe(
      "import tfk8s_magics as tk\ncluster = tk.get('mnist')\ncluster"
    );
    expect(connectCode({ name: "a'b", mode: 'between' })).toContain("tk.get('a\\'b')");
  });

  it('keeps curve points while the step moves on, restarting on a rewind', () => {
    let pts: [number, number][] = [];
    pts = addPoint(pts, 1, 2.0);
    pts = addPoint(pts, 1, 1.9);
    pts = addPoint(pts, 2, null);
    pts = addPoint(pts, 3, 1.5);
    expect(pts).toEqual([
      [1, 2.0],
      [3, 1.5]
    ]);
    expect(addPoint(pts, 0, 3)).toEqual([[0, 3]]);
    expect(addPoint([[1, 1], [2, 2], [3, 3]], 4, 4, 3)).toEqual([[2, 2], [3, 3], [4, 4]]);
    expect(polyline([[0, 1], [10, 0]], 100, 50)).toBe('0.0,0.0 100.0,50.0');
    expect(polyline([], 100, 50)).toBe('');
    expect(lossOf({ step: 1, total: null, percent: null, eta: null, rate: null, metrics: { acc: 0.5, loss: 0.3 }, time: 0 })).toBe(0.3);
    expect(lossOf({ step: 1, total: null, percent: null, eta: null, rate: null, metrics: { acc: 0.5 }, time: 0 })).toBe(0.5);
    expect(lossOf(null)).toBeNull();
  });

  it('sends only what differs from the defaults, lists split by line', () => {
    const fields: IField[] = [
      { name: 'workers', flag: '--workers', kind: 'int', default: 2, help: '', metavar: 'N' },
      { name: 'ps', flag: '--ps', kind: 'int', default: 0, help: '', metavar: 'N' },
      { name: 'legacy_keras', flag: '--no-legacy-keras', kind: 'bool', default: true, help: '', metavar: '' },
      { name: 'data_sync', flag: '--data-sync', kind: 'bool', default: false, help: '', metavar: '' },
      { name: 'env', flag: '--env', kind: 'list', default: null, help: '', metavar: 'KEY=VALUE' },
      { name: 'image', flag: '--image', kind: 'text', default: null, help: '', metavar: '' }
    ];
    expect(
      formValues(fields, {
        workers: '3',
        ps: '0',
        legacy_keras: false,
        data_sync: false,
        env: 'A=1\n\n B=2 ',
        image: ''
      })
    ).toEqual({ workers: '3', legacy_keras: false, env: ['A=1', 'B=2'] });
    expect(formValues(fields, { workers: 'x' })).toEqual({ workers: 'x' });
  });

  it('suggests a DNS label from the script name', () => {
    expect(suggestName('train/MNIST_v2.py')).toBe('mnist-v2');
    expect(suggestName('')).toBe('');
  });
});
