/**
 * The "TF clusters" sidebar: one row per cluster of the user, updated in place from the
 * stream.  Rows are keyed by name and only the text and attributes that changed are touched;
 * every row has a fixed height and every cell a fixed width, so an update never moves
 * anything (no layout shift).  Keyboard: Up/Down move between rows, Enter opens the logs,
 * Tab walks the row's buttons.
 */
import { Widget } from '@lumino/widgets';

import type { ClusterStream } from './api';
import {
  IClusterRow,
  IState,
  progressPercent,
  progressText,
  reasonText,
  sortedRows
} from './model';

export type Action =
  | 'logs'
  | 'events'
  | 'progress'
  | 'tensorboard'
  | 'serve'
  | 'stop'
  | 'delete'
  | 'insert';

export interface ISidebarOptions {
  stream: ClusterStream;
  onAction: (action: Action, row: IClusterRow) => void;
  onLaunch: () => void;
}

const BUTTONS: [Action, string, string][] = [
  ['logs', 'Logs', 'Open the live logs of every task in a tab'],
  ['events', 'Events', 'Open what happened to the cluster in a tab'],
  ['progress', 'Progress', 'Open the progress and loss curve in a tab'],
  ['tensorboard', 'TensorBoard', 'Open TensorBoard on its log dir in a tab'],
  ['serve', 'Serve', "Serve the cluster's newest exported model"],
  ['insert', 'Insert', 'Insert the code that connects the active notebook to it'],
  ['stop', 'Stop', 'Stop its tasks (logs are kept)'],
  ['delete', 'Delete', 'Delete it and its logs']
];

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

/** Set a text only when it changed (an unchanged DOM node costs the browser nothing). */
function setText(e: HTMLElement, text: string, title = text): void {
  if (e.textContent !== text) {
    e.textContent = text;
  }
  if (e.title !== title) {
    e.title = title;
  }
}

class RowView {
  readonly node = el('li', 'tfk8s-row');
  private name = el('span', 'tfk8s-row-name');
  private phase = el('span', 'tfk8s-phase');
  private tasks = el('span', 'tfk8s-row-tasks');
  private bar = el('div', 'tfk8s-bar');
  private fill = el('div', 'tfk8s-bar-fill');
  private progress = el('span', 'tfk8s-row-progress');
  private reason = el('div', 'tfk8s-row-reason');
  private buttons = new Map<Action, HTMLButtonElement>();
  row: IClusterRow;

  constructor(row: IClusterRow, onAction: (a: Action, r: IClusterRow) => void) {
    this.row = row;
    this.node.tabIndex = -1;
    this.node.setAttribute('role', 'listitem');
    this.node.dataset.name = row.name;
    const head = el('div', 'tfk8s-row-head');
    head.append(this.name, this.phase, this.tasks);
    this.bar.setAttribute('role', 'progressbar');
    this.bar.setAttribute('aria-valuemin', '0');
    this.bar.setAttribute('aria-valuemax', '100');
    this.bar.append(this.fill);
    const prog = el('div', 'tfk8s-row-line');
    prog.append(this.bar, this.progress);
    const actions = el('div', 'tfk8s-row-actions');
    for (const [action, label, help] of BUTTONS) {
      const b = el('button', `tfk8s-button tfk8s-action-${action}`, label);
      b.type = 'button';
      b.title = help;
      b.setAttribute('aria-label', `${label} ${row.name}`);
      b.addEventListener('click', ev => {
        ev.stopPropagation();
        onAction(action, this.row);
      });
      this.buttons.set(action, b);
      actions.append(b);
    }
    this.node.append(head, prog, this.reason, actions);
    this.update(row);
  }

  update(row: IClusterRow): void {
    this.row = row;
    setText(this.name, row.name, `${row.name} (${row.mode}, ${row.backend}) — ${row.log_dir}`);
    setText(this.phase, row.phase);
    if (this.phase.dataset.phase !== row.phase) {
      this.phase.dataset.phase = row.phase;
      this.node.dataset.phase = row.phase;
    }
    setText(this.tasks, `${row.ready}/${row.total}`, `${row.ready} of ${row.total} tasks ready`);
    const pct = progressPercent(row);
    const width = `${pct.toFixed(1)}%`;
    if (this.fill.style.width !== width) {
      this.fill.style.width = width;
      this.bar.setAttribute('aria-valuenow', pct.toFixed(0));
    }
    setText(this.progress, progressText(row));
    setText(this.reason, reasonText(row));
    this.buttons.get('stop')!.disabled = row.terminal;
    this.buttons.get('insert')!.disabled = row.terminal;
  }
}

export class ClusterSidebar extends Widget {
  private list = el('ul', 'tfk8s-list');
  private status = el('div', 'tfk8s-status');
  private empty = el('div', 'tfk8s-empty');
  private rows = new Map<string, RowView>();

  constructor(private options: ISidebarOptions) {
    super();
    this.id = 'tfk8s-sidebar';
    this.addClass('tfk8s-sidebar');
    this.title.caption = 'TF clusters';
    const header = el('div', 'tfk8s-header');
    const title = el('h2', 'tfk8s-title', 'TF clusters');
    const launch = el('button', 'tfk8s-button tfk8s-launch', 'Launch…');
    launch.type = 'button';
    launch.title = 'Launch a cluster from a script chosen in the file browser';
    launch.addEventListener('click', () => options.onLaunch());
    header.append(title, launch);
    this.list.setAttribute('role', 'list');
    this.list.setAttribute('aria-label', 'TF clusters');
    this.list.addEventListener('keydown', ev => this.onKey(ev));
    this.empty.textContent =
      'No clusters yet. Launch one with Launch…, %tfcluster launch or tfk8s submit.';
    this.node.append(header, this.status, this.list, this.empty);
    options.stream.changed.connect((_, state) => this.render(state));
    options.stream.connection.connect(() => this.render(options.stream.state));
    this.render(options.stream.state);
  }

  /** The row element of cluster `name` (tests and the launch form use it). */
  rowNode(name: string): HTMLElement | null {
    return this.rows.get(name)?.node ?? null;
  }

  private render(state: IState): void {
    const connected = this.options.stream.connected;
    const status = !connected
      ? 'Reconnecting to the server…'
      : state.error || (state.backend ? `backend: ${state.backend}` : '');
    setText(this.status, status);
    this.status.dataset.state = !connected ? 'offline' : state.error ? 'error' : 'ok';
    const rows = sortedRows(state);
    const seen = new Set<string>();
    let before: ChildNode | null = this.list.firstChild;
    for (const row of rows) {
      seen.add(row.name);
      let view = this.rows.get(row.name);
      if (!view) {
        view = new RowView(row, this.options.onAction);
        this.rows.set(row.name, view);
      } else if (view.row !== row) {
        view.update(row);
      }
      if (view.node !== before) {
        this.list.insertBefore(view.node, before);
      } else {
        before = before.nextSibling;
      }
    }
    for (const [name, view] of this.rows) {
      if (!seen.has(name)) {
        view.node.remove();
        this.rows.delete(name);
      }
    }
    this.empty.hidden = rows.length > 0 || !connected;
    // One row is reachable with Tab (roving tabindex); the arrows move within the list.
    const first = this.list.querySelector<HTMLElement>('.tfk8s-row[tabindex="0"]');
    if (!first && this.list.firstElementChild) {
      (this.list.firstElementChild as HTMLElement).tabIndex = 0;
    }
  }

  private onKey(ev: KeyboardEvent): void {
    const row = (ev.target as HTMLElement).closest<HTMLElement>('.tfk8s-row');
    if (!row) {
      return;
    }
    let next: Element | null = null;
    if (ev.key === 'ArrowDown') {
      next = row.nextElementSibling;
    } else if (ev.key === 'ArrowUp') {
      next = row.previousElementSibling;
    } else if (ev.key === 'Home') {
      next = this.list.firstElementChild;
    } else if (ev.key === 'End') {
      next = this.list.lastElementChild;
    } else if (ev.key === 'Enter' && ev.target === row) {
      const view = this.rows.get(row.dataset.name ?? '');
      if (view) {
        this.options.onAction('logs', view.row);
      }
      ev.preventDefault();
      return;
    }
    if (next instanceof HTMLElement) {
      for (const r of this.list.querySelectorAll<HTMLElement>('.tfk8s-row')) {
        r.tabIndex = -1;
      }
      next.tabIndex = 0;
      next.focus();
      ev.preventDefault();
    }
  }
}
