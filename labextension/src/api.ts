/**
 * Talking to the server extension: REST under `/tfk8s/` (ServerConnection adds the token and
 * the XSRF header) and one WebSocket that pushes rows and followed logs, reconnecting with a
 * bounded back-off after a server restart.
 */
import { URLExt } from '@jupyterlab/coreutils';
import { ServerConnection } from '@jupyterlab/services';
import { Signal, ISignal } from '@lumino/signaling';

import { applyMessage, emptyState, IState, StreamMessage } from './model';

/** A REST call's failure, carrying the server's one sentence. */
export class ApiError extends Error {
  constructor(
    message: string,
    readonly status: number
  ) {
    super(message);
  }
}

export async function requestAPI<T>(
  path: string,
  init: RequestInit = {}
): Promise<T> {
  const settings = ServerConnection.makeSettings();
  const url = URLExt.join(settings.baseUrl, 'tfk8s', path);
  let response: Response;
  try {
    response = await ServerConnection.makeRequest(url, init, settings);
  } catch (e) {
    throw new ApiError(`the server cannot be reached (${e}): is it running?`, 0);
  }
  const text = await response.text();
  let data: any = {};
  if (text) {
    try {
      data = JSON.parse(text);
    } catch {
      data = { message: text };
    }
  }
  if (!response.ok) {
    throw new ApiError(
      data.message || `${response.status} ${response.statusText}`,
      response.status
    );
  }
  return data as T;
}

type LogsListener = (
  lines: [string, string, number][] | null,
  ended: boolean
) => void;

/** The push channel: the cluster rows as state, and log subscriptions by id. */
export class ClusterStream {
  private _state: IState = emptyState();
  private _ws: WebSocket | null = null;
  private _changed = new Signal<this, IState>(this);
  private _connection = new Signal<this, boolean>(this);
  private _follows = new Map<string, { name: string; cb: LogsListener }>();
  private _next = 0;
  private _retry = 0;
  private _timer: number | null = null;
  private _disposed = false;
  connected = false;

  constructor() {
    this._connect();
  }

  get state(): IState {
    return this._state;
  }

  /** Emitted with the new state after every message that changed a row. */
  get changed(): ISignal<this, IState> {
    return this._changed;
  }

  /** Emitted when the socket opens (true) or drops (false). */
  get connection(): ISignal<this, boolean> {
    return this._connection;
  }

  /**
   * Follow a cluster's logs: `cb(lines)` for every batch (the kept log first), `cb(null)`
   * when a reconnect restarts the stream from the beginning (the view clears itself), and
   * `cb([], true)` when the cluster has ended.  Returns the function that stops following.
   */
  follow(name: string, cb: LogsListener): () => void {
    const id = String(++this._next);
    this._follows.set(id, { name, cb });
    this._send({ type: 'follow', id, name });
    return () => {
      this._follows.delete(id);
      this._send({ type: 'unfollow', id });
    };
  }

  dispose(): void {
    this._disposed = true;
    if (this._timer !== null) {
      window.clearTimeout(this._timer);
    }
    this._ws?.close();
  }

  private _send(msg: object): void {
    if (this._ws && this._ws.readyState === WebSocket.OPEN) {
      this._ws.send(JSON.stringify(msg));
    }
  }

  private _connect(): void {
    const settings = ServerConnection.makeSettings();
    let url = URLExt.join(settings.wsUrl, 'tfk8s', 'stream');
    if (settings.token) {
      url += `?token=${encodeURIComponent(settings.token)}`;
    }
    const ws = new WebSocket(url);
    this._ws = ws;
    ws.onopen = () => {
      this._retry = 0;
      this.connected = true;
      this._connection.emit(true);
      for (const [id, f] of this._follows) {
        f.cb(null, false);
        this._send({ type: 'follow', id, name: f.name });
      }
    };
    ws.onmessage = ev => this._onMessage(JSON.parse(ev.data) as StreamMessage);
    ws.onclose = () => {
      if (this._ws !== ws) {
        return;
      }
      this._ws = null;
      if (this.connected) {
        this.connected = false;
        this._connection.emit(false);
      }
      if (!this._disposed) {
        // 0.5 s, 1 s, 2 s, ... at most 5 s between tries: back soon after a server restart.
        const delay = Math.min(5000, 500 * 2 ** this._retry++);
        this._timer = window.setTimeout(() => this._connect(), delay);
      }
    };
  }

  private _onMessage(msg: StreamMessage): void {
    if (msg.type === 'logs' || msg.type === 'logs_end') {
      const f = this._follows.get(msg.id);
      if (f) {
        f.cb(msg.type === 'logs' ? msg.lines : [], msg.type === 'logs_end');
      }
      return;
    }
    const next = applyMessage(this._state, msg);
    if (next !== this._state) {
      this._state = next;
      this._changed.emit(next);
    }
  }
}
