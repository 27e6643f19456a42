/**
 * The tfk8s-lab JupyterLab extension: the "TF clusters" sidebar, its main-area views
 * (logs, events, progress, TensorBoard, the launch form) and the commands behind them.
 * Opening a view that is already open focuses its tab instead of opening a second one.
 */
import {
  ILabShell,
  JupyterFrontEnd,
  JupyterFrontEndPlugin
} from '@jupyterlab/application';
import {
  Dialog,
  IFrame,
  MainAreaWidget,
  Notification,
  showDialog
} from '@jupyterlab/apputils';
import { URLExt } from '@jupyterlab/coreutils';
import { IDefaultFileBrowser } from '@jupyterlab/filebrowser';
import { INotebookTracker, NotebookActions } from '@jupyterlab/notebook';
import { ServerConnection } from '@jupyterlab/services';
import { LabIcon } from '@jupyterlab/ui-components';
import { Widget } from '@lumino/widgets';

import { ClusterStream, requestAPI } from './api';
import { LaunchPanel } from './launch';
import { connectCode, IClusterRow } from './model';
import { EventsPanel, LogsPanel, ProgressPanel } from './panels';
import { Action, ClusterSidebar } from './sidebar';

const ICON_SVG = `<svg xmlns="http://www.w3.org/2000/svg" viewBox="0 0 24 24"><g class="jp-icon3" fill="#616161"><rect x="3" y="3" width="7" height="7" rx="1"/><rect x="14" y="3" width="7" height="7" rx="1"/><rect x="3" y="14" width="7" height="7" rx="1"/><rect x="14" y="14" width="7" height="7" rx="1"/></g></svg>`;
const icon = new LabIcon({ name: 'tfk8s:clusters', svgstr: ICON_SVG });

const COMMANDS = {
  launch: 'tfk8s:launch',
  launchFile: 'tfk8s:launch-file',
  logs: 'tfk8s:logs',
  events: 'tfk8s:events',
  progress: 'tfk8s:progress',
  tensorboard: 'tfk8s:tensorboard',
  insert: 'tfk8s:insert-connect'
};

const plugin: JupyterFrontEndPlugin<void> = {
  id: 'tfk8s-sidebar:plugin',
  description: 'The TF clusters sidebar of tfk8s-lab.',
  autoStart: true,
  requires: [ILabShell],
  optional: [INotebookTracker, IDefaultFileBrowser],
  activate: (
    app: JupyterFrontEnd,
    shell: ILabShell,
    notebooks: INotebookTracker | null,
    browser: IDefaultFileBrowser | null
  ) => {
    const stream = new ClusterStream();
    const open = new Map<string, MainAreaWidget>();

    /** Focus the view `key` if it is open, else make it with `make` and add it. */
    function openView(key: string, label: string, make: () => Widget): MainAreaWidget {
      const existing = open.get(key);
      if (existing && !existing.isDisposed) {
        shell.activateById(existing.id);
        return existing;
      }
      const content = make();
      const w = new MainAreaWidget({ content });
      w.id = `tfk8s-${key.replace(/[^a-zA-Z0-9-]/g, '-')}`;
      w.title.label = label;
      w.title.icon = icon;
      w.title.closable = true;
      w.addClass('tfk8s-main');
      open.set(key, w);
      w.disposed.connect(() => {
        if (open.get(key) === w) {
          open.delete(key);
        }
      });
      shell.add(w, 'main');
      shell.activateById(w.id);
      return w;
    }

    function selectedScript(): string {
      if (!browser) {
        return '';
      }
      for (const item of browser.selectedItems()) {
        if (item.type === 'file' && item.path.endsWith('.py')) {
          return item.path;
        }
      }
      return '';
    }

    function launchForm(script: string): void {
      const w = openView('launch', 'Launch TF cluster', () => new LaunchPanel(script, () => {}));
      if (script) {
        (w.content as LaunchPanel).script = script;
      }
    }

    async function tensorboard(name: string): Promise<void> {
      const info = await requestAPI<{ port: number; url: string; local: boolean }>(
        `clusters/${encodeURIComponent(name)}/tensorboard`,
        { method: 'POST' }
      );
      const base = ServerConnection.makeSettings().baseUrl;
      // A TensorBoard on this machine goes through jupyter-server-proxy, behind the server's login.
      const url = info.local ? URLExt.join(base, 'proxy', String(info.port), '/') : info.url;
      openView(`tensorboard:${name}`, `TensorBoard: ${name}`, () => {
        const frame = new IFrame({
          sandbox: ['allow-scripts', 'allow-same-origin', 'allow-forms', 'allow-popups']
        });
        frame.url = url;
        frame.addClass('tfk8s-tensorboard');
        frame.node.dataset.url = url;
        return frame;
      });
    }

    function insert(row: IClusterRow): void {
      const panel = notebooks?.currentWidget;
      if (!panel) {
        Notification.warning(
          `Open a notebook first: the code connecting to ${row.name} goes into the active notebook.`
        );
        return;
      }
      const nb = panel.content;
      NotebookActions.insertBelow(nb);
      nb.activeCell?.model.sharedModel.setSource(connectCode(row));
      shell.activateById(panel.id);
    }

    async function act(action: Action, row: IClusterRow): Promise<void> {
      const path = `clusters/${encodeURIComponent(row.name)}`;
      try {
        switch (action) {
          case 'logs':
            openView(`logs:${row.name}`, `Logs: ${row.name}`, () => new LogsPanel(row.name, stream));
            break;
          case 'events':
            openView(`events:${row.name}`, `Events: ${row.name}`, () => new EventsPanel(row.name, stream));
            break;
          case 'progress':
            openView(`progress:${row.name}`, `Progress: ${row.name}`, () => new ProgressPanel(row.name, stream));
            break;
          case 'tensorboard':
            await tensorboard(row.name);
            break;
          case 'serve': {
            const res = await requestAPI<{ text: string }>(`${path}/serve`, { method: 'POST' });
            Notification.success(`${row.name}: ${res.text}`, { autoClose: 10000 });
            break;
          }
          case 'insert':
            insert(row);
            break;
          case 'stop':
            await requestAPI(`${path}/stop`, { method: 'POST' });
            break;
          case 'delete': {
            const answer = await showDialog({
              title: `Delete ${row.name}?`,
              body: `Its tasks end and its logs (${row.log_dir}) are removed.`,
              buttons: [Dialog.cancelButton(), Dialog.warnButton({ label: 'Delete' })]
            });
            if (answer.button.accept) {
              await requestAPI(path, { method: 'DELETE' });
            }
            break;
          }
        }
      } catch (e) {
        Notification.error(`${row.name}: ${(e as Error).message}`, { autoClose: false });
      }
    }

    const sidebar = new ClusterSidebar({
      stream,
      onAction: (a, r) => void act(a, r),
      onLaunch: () => launchForm(selectedScript())
    });
    sidebar.title.icon = icon;
    shell.add(sidebar, 'left', { rank: 210 });

    const row = (args: any): IClusterRow | undefined =>
      stream.state.clusters.get(String(args.name ?? ''));
    app.commands.addCommand(COMMANDS.launch, {
      label: 'Launch a TF cluster…',
      execute: () => launchForm(selectedScript())
    });
    app.commands.addCommand(COMMANDS.launchFile, {
      label: 'Launch as a TF cluster…',
      icon,
      execute: () => launchForm(selectedScript())
    });
    app.contextMenu.addItem({
      command: COMMANDS.launchFile,
      selector: '.jp-DirListing-item[data-file-type="python"]',
      rank: 60
    });
    for (const [key, action] of [
      ['logs', 'logs'],
      ['events', 'events'],
      ['progress', 'progress'],
      ['tensorboard', 'tensorboard'],
      ['insert', 'insert']
    ] as [keyof typeof COMMANDS, Action][]) {
      app.commands.addCommand(COMMANDS[key], {
        label: args => `TF cluster ${action}: ${args.name ?? ''}`,
        execute: args => {
          const r = row(args);
          if (r) {
            return act(action, r);
          }
        }
      });
    }
  }
};

export default plugin;
