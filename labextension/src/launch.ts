/**
 * The launch form: one field per option of `%tfcluster launch`, as the server's options
 * registry describes them (same names, types, defaults and help); the server parses and
 * checks what is sent exactly as the magic does, and its one-sentence error is shown here.
 */
import { Widget } from '@lumino/widgets';

import { requestAPI } from './api';
import { formValues, IClusterRow, IField, suggestName } from './model';

/** Shown first; every other option is under "More options". */
const MAIN = ['mode', 'workers', 'ps', 'chief', 'evaluator', 'restart_budget', 'backend'];

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

export class LaunchPanel extends Widget {
  private form = el('form', 'tfk8s-form');
  private nameInput = el('input', 'tfk8s-input');
  private scriptInput = el('input', 'tfk8s-input');
  private error = el('div', 'tfk8s-form-error');
  private done = el('div', 'tfk8s-form-done');
  private inputs = new Map<string, HTMLInputElement | HTMLTextAreaElement>();
  private fields: IField[] = [];
  private button = el('button', 'tfk8s-button tfk8s-form-submit', 'Launch');

  constructor(
    script: string,
    private onLaunched: (row: IClusterRow) => void
  ) {
    super();
    this.addClass('tfk8s-launch');
    this.error.setAttribute('role', 'alert');
    this.done.setAttribute('role', 'status');
    this.nameInput.name = 'name';
    this.nameInput.required = true;
    this.nameInput.placeholder = 'e.g. mnist';
    this.nameInput.value = suggestName(script);
    this.scriptInput.name = 'script';
    this.scriptInput.value = script;
    this.form.append(
      this.labelled('name', 'cluster name (a DNS-1123 label, e.g. mnist)', this.nameInput),
      this.labelled(
        'script',
        'training script: a .py file, chosen in the file browser (path from the server root)',
        this.scriptInput
      )
    );
    this.button.type = 'submit';
    this.form.addEventListener('submit', ev => {
      ev.preventDefault();
      void this.submit();
    });
    this.node.append(this.form);
    void this.load();
  }

  set script(path: string) {
    this.scriptInput.value = path;
    if (!this.nameInput.value) {
      this.nameInput.value = suggestName(path);
    }
  }

  private labelled(name: string, help: string, input: HTMLElement): HTMLElement {
    const row = el('label', 'tfk8s-field');
    row.dataset.option = name;
    const title = el('span', 'tfk8s-field-name', name);
    const hint = el('span', 'tfk8s-field-help', help);
    row.append(title, input, hint);
    return row;
  }

  private async load(): Promise<void> {
    try {
      const data = await requestAPI<{ fields: IField[] }>('form');
      this.fields = data.fields;
    } catch (e) {
      this.error.textContent = (e as Error).message;
      this.form.append(this.error);
      return;
    }
    const more = el('details', 'tfk8s-more');
    more.append(el('summary', '', 'More options'));
    const main = el('div', 'tfk8s-main-fields');
    for (const f of this.fields) {
      (MAIN.includes(f.name) ? main : more).append(this.fieldRow(f));
    }
    this.form.append(main, more, this.error, this.button, this.done);
  }

  private fieldRow(f: IField): HTMLElement {
    let input: HTMLInputElement | HTMLTextAreaElement;
    if (f.kind === 'list') {
      input = el('textarea', 'tfk8s-input');
      input.rows = 2;
      input.placeholder = `${f.metavar || 'VALUE'}, one a line`;
    } else {
      input = el('input', 'tfk8s-input');
      if (f.kind === 'bool') {
        input.type = 'checkbox';
        input.checked = f.default === true;
      } else {
        // Text even for numbers: the server converts it as the magic does, with its sentence.
        input.type = 'text';
        input.inputMode = f.kind === 'int' ? 'numeric' : f.kind === 'float' ? 'decimal' : 'text';
        input.value = f.default === null ? '' : String(f.default);
        input.placeholder = f.metavar;
      }
    }
    input.name = f.name;
    this.inputs.set(f.name, input);
    const help = `${f.flag}: ${f.help}`;
    return this.labelled(f.name, help, input);
  }

  private async submit(): Promise<void> {
    this.error.textContent = '';
    this.done.textContent = '';
    const raw: { [k: string]: string | boolean } = {};
    for (const [name, input] of this.inputs) {
      raw[name] =
        input instanceof HTMLInputElement && input.type === 'checkbox'
          ? input.checked
          : input.value;
    }
    this.button.disabled = true;
    try {
      const data = await requestAPI<{ cluster: IClusterRow }>('clusters', {
        method: 'POST',
        body: JSON.stringify({
          name: this.nameInput.value.trim(),
          script: this.scriptInput.value.trim(),
          options: formValues(this.fields, raw)
        })
      });
      this.done.textContent = `${data.cluster.name}: launched on ${data.cluster.backend}; it is in the TF clusters sidebar.`;
      this.onLaunched(data.cluster);
    } catch (e) {
      this.error.textContent = (e as Error).message;
    } finally {
      this.button.disabled = false;
    }
  }
}
