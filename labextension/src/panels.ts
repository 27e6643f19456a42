/**
 * The main-area views of one cluster: live logs (a tab per task), events, progress with the
 * loss curve.  Each is a plain Lumino widget wrapped in a MainAreaWidget by the plugin, so it
 * docks, splits and closes like any JupyterLab tab.
 */
import { Widget } from '@lumino/widgets';

import { ClusterStream, requestAPI } from './api';
import {
  addPoint,
  firstTask,
  fmtDuration,
  IClusterRow,
  lossOf,
  polyline,
  progressPercent,
  progressText,
  reasonText
} from './model';

/** Lines kept per task in a logs tab (the whole log stays on disk: `tfk8s logs NAME`). */
export const MAX_LINES = 5000;

function el<K extends keyof HTMLElementTagNameMap>(
  tag: K,
  cls: string,
  text = ''
): HTMLElementTagNameMap[K] {
  const e = document.createElement(tag);
  e.className = cls;
  if (text) {
    e.textContent = text;
  }
  return e;
}

/** A cluster's live logs: one tab per task, the first failed task (else the first) selected. */
export class LogsPanel extends Widget {
  private tabs = el('div', 'tfk8s-logs-tabs');
  private panes = el('div', 'tfk8s-logs-panes');
  private state = el('div', 'tfk8s-logs-state');
  private byTask = new Map<
    string,
    { tab: HTMLButtonElement; pre: HTMLPreElement; n: number; chunks: number[] }
  >();
  private selected: string | null = null;
  private unfollow: () => void;

  constructor(
    readonly cluster: string,
    stream: ClusterStream
  ) {
    super();
    this.addClass('tfk8s-logs');
    this.tabs.setAttribute('role', 'tablist');
    this.tabs.setAttribute('aria-label', `tasks of ${cluster}`);
    this.tabs.addEventListener('keydown', ev => this.onKey(ev));
    this.node.append(this.tabs, this.state, this.panes);
    const row = stream.state.clusters.get(cluster);
    for (const t of row?.tasks ?? []) {
      this.pane(t.name);
    }
    const first = row ? firstTask(row) : null;
    if (first) {
      this.select(first);
    }
    this.state.textContent = 'following…';
    this.unfollow = stream.follow(cluster, (lines, ended) => this.onLines(lines, ended));
  }

  dispose(): void {
    this.unfollow();
    super.dispose();
  }

  /** The task selected now (tests read it). */
  get selectedTask(): string | null {
    return this.selected;
  }

  select(task: string): void {
    this.selected = task;
    for (const [name, p] of this.byTask) {
      const on = name === task;
      p.tab.setAttribute('aria-selected', String(on));
      p.tab.tabIndex = on ? 0 : -1;
      p.pre.hidden = !on;
    }
  }

  private pane(task: string) {
    let p = this.byTask.get(task);
    if (!p) {
      const tab = el('button', 'tfk8s-logs-tab', task);
      tab.type = 'button';
      tab.setAttribute('role', 'tab');
      tab.dataset.task = task;
      tab.addEventListener('click', () => this.select(task));
      const pre = el('pre', 'tfk8s-logs-pre');
      pre.setAttribute('role', 'tabpanel');
      pre.setAttribute('aria-label', `log of ${task}`);
      pre.tabIndex = 0;
      pre.dataset.task = task;
      pre.hidden = true;
      this.tabs.append(tab);
      this.panes.append(pre);
      p = { tab, pre, n: 0, chunks: [] as number[] };
      this.byTask.set(task, p);
      if (this.selected === null) {
        this.select(task);
      } else {
        tab.tabIndex = -1;
      }
    }
    return p;
  }

  private onLines(lines: [string, string, number][] | null, ended: boolean): void {
    if (lines === null) {
      // The stream restarts from the beginning after a reconnect.
      for (const p of this.byTask.values()) {
        p.pre.textContent = '';
        p.n = 0;
        p.chunks = [];
      }
      this.state.textContent = 'following…';
      return;
    }
    const byTask = new Map<string, string[]>();
    for (const [task, text] of lines) {
      let l = byTask.get(task);
      if (!l) {
        byTask.set(task, (l = []));
      }
      l.push(text);
    }
    for (const [task, texts] of byTask) {
      const p = this.pane(task);
      const pre = p.pre;
      const atEnd = pre.scrollHeight - pre.scrollTop - pre.clientHeight < 8;
      // Text nodes only: a line that looks like HTML stays text.
      pre.append(document.createTextNode(texts.join('\n') + '\n'));
      p.n += texts.length;
      p.chunks.push(texts.length);
      // Whole chunks are dropped from the top: the newest MAX_LINES (or a little more) stay.
      while (p.chunks.length > 1 && p.n - p.chunks[0] >= MAX_LINES && pre.firstChild) {
        pre.firstChild.remove();
        p.n -= p.chunks.shift()!;
      }
      if (atEnd) {
        pre.scrollTop = pre.scrollHeight;
      }
    }
    if (ended) {
      this.state.textContent = 'the cluster has ended: this is its whole log';
    }
  }

  private onKey(ev: KeyboardEvent): void {
    const names = [...this.byTask.keys()];
    const i = this.selected ? names.indexOf(this.selected) : -1;
    let j = -1;
    if (ev.key === 'ArrowRight') {
      j = (i + 1) % names.length;
    } else if (ev.key === 'ArrowLeft') {
      j = (i - 1 + names.length) % names.length;
    }
    if (j >= 0) {
      this.select(names[j]);
      this.byTask.get(names[j])!.tab.focus();
      ev.preventDefault();
    }
  }
}

/** What happened to a cluster, re-read whenever its row changes. */
export class EventsPanel extends Widget {
  private table = el('table', 'tfk8s-events-table');
  private note = el('div', 'tfk8s-events-note');
  private pending = false;
  private again = false;

  constructor(
    readonly cluster: string,
    private stream: ClusterStream
  ) {
    super();
    this.addClass('tfk8s-events');
    this.node.append(this.note, this.table);
    stream.changed.connect(this.onChanged, this);
    void this.load();
  }

  dispose(): void {
    this.stream.changed.disconnect(this.onChanged, this);
    super.dispose();
  }

  private onChanged(): void {
    if (this.isDisposed) {
      return;
    }
    if (this.pending) {
      this.again = true;
    } else {
      void this.load();
    }
  }

  private async load(): Promise<void> {
    this.pending = true;
    try {
      const data = await requestAPI<{ events: any[] }>(
        `clusters/${encodeURIComponent(this.cluster)}/events`
      );
      const body = el('tbody', '');
      for (const e of data.events) {
        const tr = el('tr', e.type === 'Warning' ? 'tfk8s-warning' : '');
        tr.append(
          el('td', '', new Date(e.time * 1000).toLocaleTimeString()),
          el('td', '', e.task),
          el('td', '', e.reason),
          el('td', '', e.message)
        );
        body.append(tr);
      }
      const head = el('thead', '');
      const hr = el('tr', '');
      for (const h of ['time', 'task', 'reason', 'message']) {
        hr.append(el('th', '', h));
      }
      head.append(hr);
      this.table.replaceChildren(head, body);
      this.note.textContent = data.events.length ? '' : 'no events yet';
    } catch (e) {
      this.note.textContent = String((e as Error).message);
    } finally {
      this.pending = false;
    }
    if (this.again) {
      this.again = false;
      void this.load();
    }
  }
}

/** Progress of a cluster: phase, bar, step / ETA, and the loss curve as reports come in. */
export class ProgressPanel extends Widget {
  private summary = el('div', 'tfk8s-progress-summary');
  private bar = el('div', 'tfk8s-bar tfk8s-bar-wide');
  private fill = el('div', 'tfk8s-bar-fill');
  private curveLabel = el('div', 'tfk8s-progress-label');
  private svg = document.createElementNS('http://www.w3.org/2000/svg', 'svg');
  private line = document.createElementNS('http://www.w3.org/2000/svg', 'polyline');
  private points: [number, number][] = [];

  constructor(
    readonly cluster: string,
    private stream: ClusterStream
  ) {
    super();
    this.addClass('tfk8s-progress');
    this.bar.append(this.fill);
    this.svg.setAttribute('viewBox', '0 0 400 160');
    this.svg.setAttribute('class', 'tfk8s-curve');
    this.svg.setAttribute('role', 'img');
    this.line.setAttribute('fill', 'none');
    this.svg.append(this.line);
    this.node.append(this.summary, this.bar, this.curveLabel, this.svg);
    stream.changed.connect(this.onChanged, this);
    this.onChanged();
  }

  dispose(): void {
    this.stream.changed.disconnect(this.onChanged, this);
    super.dispose();
  }

  private onChanged(): void {
    const row: IClusterRow | undefined = this.stream.state.clusters.get(this.cluster);
    if (!row) {
      this.summary.textContent = `cluster ${this.cluster} is gone`;
      return;
    }
    const p = row.progress;
    this.summary.textContent =
      `${row.phase} · tasks ${row.ready}/${row.total}` +
      (p ? ` · ${progressText(row)}` : ' · no progress reported yet') +
      (p?.rate ? ` · ${p.rate.toPrecision(3)} steps/s` : '') +
      (row.finished ? ` · took ${fmtDuration(row.finished - row.created)}` : '') +
      (reasonText(row) ? ` — ${reasonText(row)}` : '');
    this.fill.style.width = `${progressPercent(row)}%`;
    if (p) {
      this.points = addPoint(this.points, p.step, lossOf(p));
      const metric = 'loss' in p.metrics ? 'loss' : Object.keys(p.metrics).sort()[0];
      this.curveLabel.textContent = metric
        ? `${metric} by step (${this.points.length} points since this tab opened)`
        : 'the script reports no loss';
      this.line.setAttribute('points', polyline(this.points, 400, 160));
    }
  }
}
