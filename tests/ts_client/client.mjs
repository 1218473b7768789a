// Drives mero-mcp with the official TypeScript MCP SDK client (@modelcontextprotocol/sdk, pinned in
// package.json), the client Node-based hosts such as Claude Code use. Run by tests/test_ts_client.py.
//
// stdin:  one JSON object {command, args, env, cwd} naming the server to spawn (env is what a host
//         passes; the SDK adds its own safe defaults HOME/LOGNAME/PATH/SHELL/TERM/USER underneath).
// stdout: one JSON object with what the client saw. Exit status 1 if any SDK call threw (each call's
//         exception message is in the report), 2 if the input was unusable.
import { Client } from '@modelcontextprotocol/sdk/client/index.js';
import { StdioClientTransport } from '@modelcontextprotocol/sdk/client/stdio.js';

const STDERR_TAIL = 4000;

async function readStdin() {
    const chunks = [];
    for await (const chunk of process.stdin) chunks.push(chunk);
    return JSON.parse(Buffer.concat(chunks).toString('utf8'));
}

function message(error) {
    return error instanceof Error ? `${error.constructor.name}: ${error.message}` : String(error);
}

// The parts of a CallToolResult the test looks at; `error` is set instead when the SDK threw.
function summarise(result) {
    const summary = { isError: result.isError === true, content: result.content };
    if (result.structuredContent !== undefined) summary.structuredContent = result.structuredContent;
    return summary;
}

async function main() {
    let spec;
    try {
        spec = await readStdin();
    } catch (error) {
        process.stderr.write(`client.mjs: expected {command, args, env, cwd} as JSON on stdin: ${message(error)}\n`);
        process.exit(2);
    }

    const report = { wire: [], errors: [], calls: {} };
    let failed = false;
    let stderr = '';

    const transport = new StdioClientTransport({
        command: spec.command, args: spec.args || [], env: spec.env || {}, cwd: spec.cwd, stderr: 'pipe'
    });
    transport.stderr.on('data', chunk => { stderr = (stderr + chunk.toString('utf8')).slice(-STDERR_TAIL); });

    // Stdio has no protocol-version header, so the SDK has nothing to tell the transport; the client calls
    // setProtocolVersion only when it exists, which makes it the one place the negotiated version shows.
    transport.setProtocolVersion = version => { report.protocolVersion = version; };

    // A short wire log (direction, id, method or result/error) without wrapping the SDK's own handling.
    const send = transport.send.bind(transport);
    transport.send = msg => {
        report.wire.push({ dir: 'out', id: msg.id, method: msg.method });
        return send(msg);
    };
    let onmessage;
    Object.defineProperty(transport, 'onmessage', {
        configurable: true,
        get: () => onmessage,
        set: handler => {
            onmessage = handler && (msg => {
                const entry = { dir: 'in', id: msg.id, method: msg.method };
                if (msg.error) entry.error = msg.error;
                report.wire.push(entry);
                return handler(msg);
            });
        }
    });

    const client = new Client({ name: 'mero-mcp-ts-interop', version: '0.0.0' });
    client.onerror = error => { report.errors.push(message(error)); };   // e.g. a non-JSON stdout line

    async function step(name, run) {
        try {
            return await run();
        } catch (error) {
            failed = true;
            report.calls[name] = { error: message(error), code: error.code };
            return undefined;
        }
    }

    async function call(name, tool, args) {
        const result = await step(name, () => client.callTool({ name: tool, arguments: args }));
        if (result !== undefined) report.calls[name] = summarise(result);
        return result;
    }

    const started = Date.now();
    const connected = await step('connect', () => client.connect(transport).then(() => true));
    report.connectMs = Date.now() - started;
    const child = transport._process;         // kept to see how the server exits when the client closes

    if (connected) {
        report.serverInfo = client.getServerVersion();
        report.capabilities = client.getServerCapabilities();

        const listed = await step('tools/list', () => client.listTools());
        if (listed) {
            report.tools = listed.tools.map(t => t.name);
            report.toolsNextCursor = listed.nextCursor ?? null;
            report.toolsWithOutputSchema = listed.tools.filter(t => t.outputSchema).map(t => t.name);
        }

        await call('node_status', 'node_status', {});
        const selected = await call('select_app', 'select_app', { app: 'kv-store' });
        const handle = selected?.structuredContent?.app_handle;
        report.handle = typeof handle === 'string' ? handle : null;

        await call('len_before', 'kv_store_len', { app_handle: handle });
        await call('entries_before', 'kv_store_entries', { app_handle: handle });
        await call('set', 'kv_store_set', { app_handle: handle, key: 'greeting', value: 'hello' });
        await call('len_after', 'kv_store_len', { app_handle: handle });
        await call('entries_after', 'kv_store_entries', { app_handle: handle });
        await call('refused', 'kv_store_len', {});       // no handle, no context: refused, nothing runs

        const resources = await step('resources/list', () => client.listResources());
        if (resources) {
            report.resources = resources.resources;
            const guide = resources.resources.find(r => r.uri.endsWith('/guide'));
            if (guide) {
                const read = await step('resources/read', () => client.readResource({ uri: guide.uri }));
                if (read) report.guide = read.contents;
            }
        }
    }

    const closing = Date.now();
    await step('close', () => client.close());
    report.closeMs = Date.now() - closing;
    report.serverExit = child ? { code: child.exitCode, signal: child.signalCode } : null;
    report.totalMs = Date.now() - started;
    if (failed || report.errors.length) report.serverStderrTail = stderr;
    process.stdout.write(JSON.stringify(report) + '\n');
    process.exitCode = failed ? 1 : 0;
}

main().catch(error => {
    process.stderr.write(`client.mjs: ${error && error.stack || error}\n`);
    process.exit(2);
});
