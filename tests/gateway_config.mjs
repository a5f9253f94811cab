// The gateway's config file for the Node suites (tests/browser), as tests/gateway_config.py is for
// the Python ones: a description, an object of the TOML's shape (documented in
// testkit/src/bin/gateway-config.rs), written as TOML by the test kit's typed config builder,
// the one the Rust tests use, through its `gateway-config` binary (CONFIG_BIN= overrides
// target/debug/gateway-config). No suite writes gateway TOML by hand.
import { execFileSync } from 'node:child_process';
import fs from 'node:fs';
import path from 'node:path';
import { fileURLToPath } from 'node:url';

const ROOT = path.resolve(path.dirname(fileURLToPath(import.meta.url)), '..');
export const CONFIG_BIN = path.resolve(ROOT, process.env.CONFIG_BIN || 'target/debug/gateway-config');

// The TOML for `description`; throws with the tool's message when it refuses it.
export function renderGatewayConfig(description, bin = CONFIG_BIN) {
  if (!fs.existsSync(bin)) throw new Error(`${bin} missing: cargo build -p testkit --bin gateway-config`);
  try {
    return execFileSync(bin, { input: JSON.stringify(description), encoding: 'utf8', stdio: ['pipe', 'pipe', 'pipe'] });
  } catch (err) {
    throw new Error(`${bin} refused the gateway's description: ${String(err.stderr || err.message).trim()}`);
  }
}
