#!/usr/bin/env node
// Validates AsyncAPI documents (JSON or YAML) with the official @asyncapi/parser.
//
// Usage: node validate.mjs [--] FILE...
//
// For every file, each diagnostic (severity, code, path, message) goes to
// stderr; a valid file prints one `ok:` line to stdout.
// Exit codes: 0 all files valid (warnings allowed), 1 any file has an
// error-severity diagnostic (severity 0) or cannot be read/parsed,
// 2 usage error.
import { readFile } from 'node:fs/promises';
import path from 'node:path';
import { Parser, DiagnosticSeverity } from '@asyncapi/parser';

const SEVERITY = ['error', 'warning', 'info', 'hint'];

function usage(msg) {
  if (msg) process.stderr.write(`validate.mjs: ${msg}\n`);
  process.stderr.write('usage: node validate.mjs [--] FILE...\n');
  process.exit(2);
}

const argv = process.argv.slice(2);
const dashdash = argv.indexOf('--');
const opts = dashdash === -1 ? argv : argv.slice(0, dashdash);
if (opts.some((f) => f === '-h' || f === '--help')) usage();
const unknownFlag = opts.find((f) => f.startsWith('-'));
if (unknownFlag) usage(`unknown option ${unknownFlag}`);
const files = dashdash === -1 ? argv : [...opts, ...argv.slice(dashdash + 1)];
if (files.length === 0) usage('no input files');

function formatPath(p) {
  if (!Array.isArray(p) || p.length === 0) return '/';
  return '/' + p.map((s) => String(s).replace(/~/g, '~0').replace(/\//g, '~1')).join('/');
}

function formatRange(d) {
  const start = d.range && d.range.start;
  return start ? `:${start.line + 1}:${start.character + 1}` : '';
}

function size(collection) {
  if (!collection) return 0;
  if (typeof collection.length === 'number') return collection.length;
  if (typeof collection.all === 'function') return collection.all().length;
  return 0;
}

const parser = new Parser();
let failed = false;

for (const file of files) {
  let text;
  try {
    text = await readFile(file, 'utf8');
  } catch (err) {
    process.stderr.write(`${file}: error: cannot read file: ${err.message}\n`);
    failed = true;
    continue;
  }

  let result;
  try {
    // `source` lets relative external $refs resolve against the file's location.
    result = await parser.parse(text, { source: path.resolve(file) });
  } catch (err) {
    process.stderr.write(`${file}: error: parser threw: ${err && err.stack ? err.stack : err}\n`);
    failed = true;
    continue;
  }

  const diagnostics = result.diagnostics || [];
  let errors = 0;
  for (const d of diagnostics) {
    const sev = SEVERITY[d.severity] ?? `severity-${d.severity}`;
    if (d.severity === DiagnosticSeverity.Error) errors += 1;
    process.stderr.write(
      `${file}${formatRange(d)}: ${sev} (${d.severity}) [${d.code}] at ${formatPath(d.path)}: ${d.message}\n`,
    );
  }

  const doc = result.document;
  if (errors > 0 || !doc) {
    process.stderr.write(
      `FAIL: ${file} (${errors} error(s), ${diagnostics.length - errors} other diagnostic(s)` +
        `${doc ? '' : ', document not produced'})\n`,
    );
    failed = true;
    continue;
  }

  process.stdout.write(
    `ok: ${file} (asyncapi ${doc.version()}, ${size(doc.channels())} channels, ` +
      `${size(doc.operations())} operations, ${size(doc.messages())} messages)\n`,
  );
}

process.exit(failed ? 1 : 0);
