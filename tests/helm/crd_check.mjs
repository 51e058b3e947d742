// Validates custom resources (a JSON array on stdin) with the validators kubernetes-models-ts generates from
// their CRDs' schemas (installed by scripts/setup_k8s_tools.sh into the folder given as the one argument).
// Prints [{kind, name, error}] (error null when valid) as JSON.
import { readFileSync } from "node:fs";
import { join } from "node:path";
import { pathToFileURL } from "node:url";

const PACKAGES = { "keda.sh/v1alpha1": "keda", "monitoring.coreos.com/v1": "prometheus-operator" };
const models = join(process.argv[2], "node_modules", "@kubernetes-models");
const results = [];
for (const resource of JSON.parse(readFileSync(0, "utf8"))) {
  const found = { kind: resource.kind, name: resource.metadata.name, error: null };
  const pkg = PACKAGES[resource.apiVersion];
  if (!pkg) {
    found.error = `no schema for ${resource.apiVersion}`;
  } else {
    const module = await import(pathToFileURL(join(models, pkg, resource.apiVersion, `${resource.kind}.js`)));
    try {
      new module[resource.kind](resource).validate();
    } catch (error) {
      found.error = error.message;
    }
  }
  results.push(found);
}
console.log(JSON.stringify(results));
