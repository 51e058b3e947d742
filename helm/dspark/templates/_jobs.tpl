{{/* The chart's Jobs: named by their pod template's hash, and talking to the Kubernetes API in Python. */}}

{{/* A Job's name (dict: root, job, pod = the rendered pod template). A Job's pod template is immutable: the
     template's hash in the name turns any change of it (image, values) into a new Job, which helm creates while
     it deletes the old one, where a patch would be refused ("field is immutable", helm/helm#7725). An upgrade
     that leaves the template alone leaves the finished Job alone. */}}
{{- define "dspark.jobName" -}}
{{- printf "%s-%s-%s" (include "dspark.fullname" .root | trunc 44 | trimSuffix "-") .job (sha256sum .pod | trunc 10) -}}
{{- end -}}

{{/* Python for a Job's container: api(method, path, body, content_type) -> (status, answer), a call to the
     Kubernetes API in the pod's namespace as its ServiceAccount (the mounted token, CA and namespace). */}}
{{- define "dspark.kubeApiPython" -}}
import json, os, ssl, sys, urllib.error, urllib.request
account = "/var/run/secrets/kubernetes.io/serviceaccount"
read = lambda name: open(os.path.join(account, name)).read().strip()
context = ssl.create_default_context(cafile=os.path.join(account, "ca.crt"))
def api(method, path, body=None, content_type="application/json"):
    url = "https://%s:%s/api/v1/namespaces/%s/%s" % (
        os.environ["KUBERNETES_SERVICE_HOST"], os.environ["KUBERNETES_SERVICE_PORT"], read("namespace"), path)
    request = urllib.request.Request(url, data=None if body is None else json.dumps(body).encode(), method=method,
                                     headers={"Authorization": "Bearer " + read("token"), "Content-Type": content_type})
    try:
        with urllib.request.urlopen(request, context=context, timeout=30) as answer:
            return answer.status, json.loads(answer.read())
    except urllib.error.HTTPError as error:
        return error.code, {}
{{- end -}}
