// One Gemini CLI discovery of mero-mcp, with Gemini CLI's own code (@google/gemini-cli-core): its McpClient spawns
// the server over stdio (with Gemini's environment sanitising), discovers the tools into its ToolRegistry, and the
// registry renders the function declarations the CLI sends the model. Reads {serverName, command, args, env, cwd,
// report} from the JSON file named by its argument and writes what it saw, as JSON, to the file `report` names (the
// core logs to stdout).
import { readFileSync, writeFileSync } from 'node:fs';
import {
  McpClient, MCPServerConfig, ResourceRegistry, ToolRegistry, WorkspaceContext,
} from '@google/gemini-cli-core';
import { PromptRegistry } from '@google/gemini-cli-core/dist/src/prompts/prompt-registry.js';

const spec = JSON.parse(readFileSync(process.argv[2], 'utf8'));

const diagnostics = [];
const cliConfig = {
  sanitizationConfig: { allowedEnvironmentVariables: [], blockedEnvironmentVariables: [],
                        enableEnvironmentVariableRedaction: true },
  emitMcpDiagnostic: (severity, message) => diagnostics.push({ severity, message }),
  isTrustedFolder: () => true,
};
// What the registry asks of the CLI's Config when it renders declarations: nothing excluded, default mode.
const registryConfig = {
  getExcludeTools: () => new Set(),
  getApprovalMode: () => 'default',
  isTopicUpdateNarrationEnabled: () => false,
  getMcpClientManager: () => undefined,
};

const report = { declarations: [], diagnostics, errors: [] };
const registries = {
  toolRegistry: new ToolRegistry(registryConfig, undefined),
  promptRegistry: new PromptRegistry(),
  resourceRegistry: new ResourceRegistry(),
};
const serverConfig = new MCPServerConfig(spec.command, spec.args, spec.env, spec.cwd);
const client = new McpClient(spec.serverName, serverConfig, new WorkspaceContext(spec.cwd), cliConfig, false, '0.61.0');
try {
  await client.connect();
  await client.discoverInto(cliConfig, registries);
  report.instructions = client.getInstructions() ?? null;
  report.declarations = registries.toolRegistry.getFunctionDeclarations().map((declaration) => ({
    name: declaration.name,
    hasSchema: Boolean(declaration.parametersJsonSchema || declaration.parameters),
    descriptionLength: (declaration.description ?? '').length,
  }));
} catch (error) {
  report.errors.push(String(error && error.stack ? error.stack : error));
} finally {
  await client.disconnect().catch((error) => report.errors.push(String(error)));
}
writeFileSync(spec.report, JSON.stringify(report));
process.exit(0);
