/**
 * The sidebar's DOM in jsdom: rows are updated in place (same nodes, so nothing is rebuilt and
 * nothing moves), ordered newest first, removed when the cluster is; the keyboard moves
 * between rows and Enter opens the logs; a button calls its action with the current row.
 */
import { Signal } from '@lumino/signaling';
import { Widget } from '@lumino/widgets';

import type { ClusterStream } from '../src/api';
import { applyMessage, emptyState, IClusterRow, IState, StreamMessage } from '../src/model';
import { Action, ClusterSidebar } from '../src/sidebar';

function row(name: string, created: number, over: Partial<IClusterRow> = {}): IClusterRow {
  return {
    name, backend: 'local', mode: 'between', phase: 'running', terminal: false, reason: '',
    stall: '', created, finished: null, detached: true, owner: 'u', log_dir: '/l', ready: 1,
    total: 2, tasks: [], failed_task: null, progress: null, ...over
  };
}

class FakeStream {
  state: IState = emptyState();
  connected = true;
  changed = new Signal<FakeStream, IState>(this);
  connection = new Signal<FakeStream, boolean>(this);
  push(msg: StreamMessage): void {
    this.state = applyMessage(this.state, msg);
    this.changed.emit(this.state);
  }
}

function setup() {
  const stream = new FakeStream();
  const calls: [Action, string][] = [];
  const sidebar = new ClusterSidebar({
    stream: stream as unknown as ClusterStream,
    onAction: (a, r) => calls.push([a, r.name]),
    onLaunch: () => calls.push(['logs', '(launch)'])
  });
  Widget.attach(sidebar, document.body);
  const names = () =>
    [...sidebar.node.querySelectorAll<HTMLElement>('.tfk8s-row')].map(r => r.dataset.name);
  return { stream, calls, sidebar, names };
}

describe('ClusterSidebar', () => {
  afterEach(() => {
    document.body.innerHTML = '';
  });

  it('lists rows newest first and updates them in place', () => {
    const { stream, sidebar, names } = setup();
    stream.push({ type: 'snapshot', backend: 'local', error: '', clusters: [row('a', 1), row('b', 2)] });
    expect(names()).toEqual(['b', 'a']);
    const node = sidebar.rowNode('a')!;
    const progress = { step: 5, total: 10, percent: 50, eta: 65, rate: 1, metrics: {}, time: 0 };
    stream.push({ type: 'cluster', cluster: row('a', 1, { phase: 'succeeded', ready: 2, progress }) });
    expect(sidebar.rowNode('a')).toBe(node);
    expect(node.dataset.phase).toBe('succeeded');
    expect(node.querySelector('.tfk8s-row-tasks')!.textContent).toBe('2/2');
    expect((node.querySelector('.tfk8s-bar-fill') as HTMLElement).style.width).toBe('100.0%');
    expect(node.querySelector('.tfk8s-row-progress')!.textContent).toBe('step 5/10 · ETA 1m05s');
    stream.push({ type: 'cluster', cluster: row('c', 3) });
    expect(names()).toEqual(['c', 'b', 'a']);
    stream.push({ type: 'removed', name: 'b' });
    expect(names()).toEqual(['c', 'a']);
    expect(sidebar.rowNode('a')).toBe(node);
  });

  it('shows what went wrong, escapes nothing into HTML, and disables Stop once ended', () => {
    const { stream, sidebar } = setup();
    const evil = '<img src=x onerror=alert(1)>';
    stream.push({
      type: 'snapshot', backend: 'local', error: '',
      clusters: [row(evil.replace(/[^a-z]/g, ''), 1, { phase: 'failed', terminal: true, reason: evil })]
    });
    const node = sidebar.node.querySelector<HTMLElement>('.tfk8s-row')!;
    expect(node.querySelector('.tfk8s-row-reason')!.textContent).toBe(evil);
    expect(node.querySelector('img')).toBeNull();
    expect(node.querySelector<HTMLButtonElement>('.tfk8s-action-stop')!.disabled).toBe(true);
    expect(node.querySelector<HTMLButtonElement>('.tfk8s-action-delete')!.disabled).toBe(false);
  });

  it('says when the server is away and when the backend cannot be listed', () => {
    const { stream, sidebar } = setup();
    stream.push({ type: 'snapshot', backend: 'local', error: '', clusters: [] });
    const status = sidebar.node.querySelector('.tfk8s-status')!;
    expect(status.textContent).toBe('backend: local');
    expect(sidebar.node.querySelector<HTMLElement>('.tfk8s-empty')!.hidden).toBe(false);
    stream.push({ type: 'error', message: 'cannot list the clusters: boom' });
    expect(status.textContent).toBe('cannot list the clusters: boom');
    stream.connected = false;
    stream.connection.emit(false);
    expect(status.textContent).toBe('Reconnecting to the server…');
  });

  it('moves between rows with the arrows, opens logs with Enter, runs buttons', () => {
    const { stream, sidebar, calls } = setup();
    stream.push({ type: 'snapshot', backend: 'local', error: '', clusters: [row('a', 1), row('b', 2)] });
    const [b, a] = [sidebar.rowNode('b')!, sidebar.rowNode('a')!];
    expect(b.tabIndex).toBe(0);
    expect(a.tabIndex).toBe(-1);
    b.focus();
    b.dispatchEvent(new KeyboardEvent('keydown', { key: 'ArrowDown', bubbles: true }));
    expect(document.activeElement).toBe(a);
    expect([a.tabIndex, b.tabIndex]).toEqual([0, -1]);
    a.dispatchEvent(new KeyboardEvent('keydown', { key: 'Enter', bubbles: true }));
    a.querySelector<HTMLButtonElement>('.tfk8s-action-delete')!.click();
    expect(calls).toEqual([['logs', 'a'], ['delete', 'a']]);
  });
});
