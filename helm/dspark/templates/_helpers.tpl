{{/* Names: <release>-dspark unless the release name already holds the chart's name. */}}
{{- define "dspark.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{- define "dspark.fullname" -}}
{{- if .Values.fullnameOverride -}}
{{- .Values.fullnameOverride | trunc 63 | trimSuffix "-" -}}
{{- else if contains (include "dspark.name" .) .Release.Name -}}
{{- .Release.Name | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name (include "dspark.name" .) | trunc 63 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}

{{/* Labels on every resource; the selector labels pick the serving pods only. */}}
{{- define "dspark.baseLabels" -}}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/part-of: dspark
app.kubernetes.io/name: {{ include "dspark.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end -}}

{{- define "dspark.labels" -}}
{{ include "dspark.baseLabels" . }}
app.kubernetes.io/component: server
{{- end -}}

{{/* Labels of every pod template (dict: root, component): no chart or app version, which change with every chart
     release: a chart-only upgrade would roll every GPU pod (and download its models again) and rename every Job. */}}
{{- define "dspark.podLabels" -}}
app.kubernetes.io/part-of: dspark
app.kubernetes.io/name: {{ include "dspark.name" .root }}
app.kubernetes.io/instance: {{ .root.Release.Name }}
app.kubernetes.io/component: {{ .component }}
{{- end -}}

{{- define "dspark.selectorLabels" -}}
app.kubernetes.io/name: {{ include "dspark.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/component: server
{{- end -}}

{{- define "dspark.routerSelectorLabels" -}}
app.kubernetes.io/name: {{ include "dspark.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/component: router
{{- end -}}

{{- define "dspark.image" -}}
{{- if .Values.image.digest -}}
{{- printf "%s:%s@%s" .Values.image.repository .Values.image.tag .Values.image.digest -}}
{{- else -}}
{{- printf "%s:%s" .Values.image.repository .Values.image.tag -}}
{{- end -}}
{{- end -}}

{{/* The Service in front of the OpenAI-compatible API: the router's when there is one. */}}
{{- define "dspark.apiBackend" -}}
{{- if .Values.router.enabled -}}
name: {{ include "dspark.fullname" . }}-router
port: {number: {{ .Values.router.port }}}
{{- else -}}
name: {{ include "dspark.fullname" . }}
port: {number: {{ .Values.http.port }}}
{{- end -}}
{{- end -}}

{{- define "dspark.adminTokensSecret" -}}
{{- .Values.admin.tokens.existingSecret | default (printf "%s-admin-tokens" (include "dspark.fullname" .)) -}}
{{- end -}}

{{- define "dspark.apiKeysSecret" -}}
{{- .Values.http.apiKey.existingSecret | default (printf "%s-api-keys" (include "dspark.fullname" .)) -}}
{{- end -}}

{{/* The Secrets the token Job generates, as a YAML list of [name, [keys]]: the admin tokens and the API keys, each
     unless an existing Secret is given. */}}
{{- define "dspark.generatedSecrets" -}}
{{- if and .Values.admin.enabled (not .Values.admin.tokens.existingSecret) }}
- [{{ include "dspark.adminTokensSecret" . | quote }}, {{ concat .Values.admin.tokens.admins .Values.admin.tokens.readers | toJson }}]
{{- end }}
{{- if and .Values.http.apiKey.enabled (not .Values.http.apiKey.existingSecret) }}
- [{{ include "dspark.apiKeysSecret" . | quote }}, {{ .Values.http.apiKey.keys | toJson }}]
{{- end }}
{{- end -}}

{{- define "dspark.hubCacheClaim" -}}
{{- .Values.hub.cache.existingClaim | default (printf "%s-hub-cache" (include "dspark.fullname" .)) -}}
{{- end -}}

{{/* Why the release can run more than one serving pod at a time (empty: it cannot): each one would mount the
     hub cache, and a claim that is not ReadWriteMany attaches to one node only. */}}
{{- define "dspark.manyPods" -}}
{{- $v := .Values -}}
{{- if $v.lws.enabled -}}
lws.enabled (lws.size pods per group)
{{- else if gt (int $v.replicaCount) 1 -}}
replicaCount={{ $v.replicaCount }}
{{- else if ne $v.autoscaling.kind "none" -}}
autoscaling.kind={{ $v.autoscaling.kind }}
{{- else if not (has (toString $v.rollingUpdate.maxSurge) (list "0" "0%")) -}}
rollingUpdate.maxSurge={{ $v.rollingUpdate.maxSurge }} (a surge pod beside the old one)
{{- end -}}
{{- end -}}

{{/* The serving pods' hub cache: "claim" or "emptyDir" (hub.cache.volume; auto: a claim only when one pod at a
     time, or every pod, can mount it). A claim that more pods mount than its access mode allows is refused. */}}
{{- define "dspark.hubCacheVolume" -}}
{{- include "dspark.checkHubCacheSize" . -}}
{{- $c := .Values.hub.cache -}}
{{- $many := include "dspark.manyPods" . -}}
{{- $shared := eq $c.accessMode "ReadWriteMany" -}}
{{- $volume := $c.volume -}}
{{- if eq $volume "auto" -}}
{{- $volume = ternary "claim" "emptyDir" (or (not $many) $shared (ne $c.existingClaim "")) -}}
{{- end -}}
{{- if and (eq $volume "claim") $many (not $shared) -}}
{{- fail (printf "hub.cache.accessMode is %s, but more than one pod mounts the hub cache claim (%s): a pod on a second node would hang attaching it. Set hub.cache.accessMode=ReadWriteMany (a claim on storage that offers it) or hub.cache.volume=emptyDir (a download per pod)" $c.accessMode $many) -}}
{{- end -}}
{{- $volume -}}
{{- end -}}

{{/* A quantity with a binary suffix (Mi, Gi or Ti: the schema allows no other for sizes), in MiB. */}}
{{- define "dspark.mebibytes" -}}
{{- mul (regexReplaceAll "[^0-9]" . "" | int64) (get (dict "Mi" 1 "Gi" 1024 "Ti" 1048576) (regexReplaceAll "^[0-9]+" . "")) -}}
{{- end -}}

{{/* The ephemeral storage a pod's emptyDirs may fill (dict: root, hubCache = the hub cache is an emptyDir here,
     capture = the pod captures traffic), as the serving (or profiling) container requests it: the three scratch
     volumes, the hub cache and the capture emptyDir, each up to its sizeLimit. So the scheduler places the pod on a node with that much disk free. */}}
{{- define "dspark.ephemeralStorage" -}}
{{- $v := .root.Values -}}
{{- $mib := mul 3 (include "dspark.mebibytes" $v.scratchSize | int64) -}}
{{- if .hubCache -}}
{{- $mib = add $mib (include "dspark.mebibytes" $v.hub.cache.size | int64) -}}
{{- end -}}
{{- if and .capture $v.capture.enabled (not $v.capture.volume.existingClaim) -}}
{{- $mib = add $mib (include "dspark.mebibytes" $v.capture.volume.sizeLimit | int64) -}}
{{- end -}}
{{ $mib }}Mi
{{- end -}}

{{/* Refuses a hub cache smaller than the hub models' sizes where the values state them (target.size,
     drafter.size): the download would fill it and the pod be evicted, after the whole download time. */}}
{{- define "dspark.checkHubCacheSize" -}}
{{- $v := .Values -}}
{{- $stated := list -}}
{{- $mib := 0 -}}
{{- range $role := list "target" "drafter" }}
{{- $m := index $v $role }}
{{- if and (has $m.source (list "hub" "s3")) $m.size }}
{{- $stated = append $stated (printf "%s.size %s" $role $m.size) }}
{{- $mib = add $mib (include "dspark.mebibytes" $m.size | int64) }}
{{- end }}
{{- end }}
{{- if gt (int64 $mib) (include "dspark.mebibytes" $v.hub.cache.size | int64) }}
{{- fail (printf "hub.cache.size (%s) is below the hub models' stated size (%s: %d Mi): the download would not fit; raise hub.cache.size" $v.hub.cache.size (join " + " $stated) $mib) }}
{{- end }}
{{- end -}}

{{/* Where a model (dict: m = target/drafter values, role) is inside the container. */}}
{{- define "dspark.modelPath" -}}
{{- $m := .m -}}
{{- if eq $m.source "hub" -}}
/models/hub/{{ required (printf "%s.hubId is required when %s.source is hub" .role .role) $m.hubId }}/{{ $m.revision }}
{{- else if eq $m.source "s3" -}}
/models/hub/s3/{{ required (printf "%s.uri is required when %s.source is s3" .role .role) $m.uri | trimPrefix "s3://" | trimSuffix "/" }}
{{- else if or (eq $m.source "pvc") (eq $m.source "oci") -}}
/models/{{ .role }}{{/* its directory on the claim, mounted there by subPath (dspark.modelMounts) */}}
{{- else -}}
{{ required (printf "%s.path is required when %s.source is image" .role .role) $m.path }}
{{- end -}}
{{- end -}}

{{/* A generated values block (settings, requestLimits, liveness) as `dspark serve` flags, --name-with-dashes value (null:
the flag's own default, which is the schema's). */}}
{{- define "dspark.settingsArgs" -}}
{{- range $name, $value := . }}
{{- if not (kindIs "invalid" $value) }}
- --{{ $name | replace "_" "-" }}
{{- if kindIs "slice" $value }}
{{- range $value }}
- {{ . | toString | quote }}
{{- end }}
{{- else if and (kindIs "float64" $value) (eq $value (float64 (int64 $value))) }}
- {{ int64 $value | toString | quote }}{{/* YAML numbers are floats to helm: 4194304, not 4.194304e+06 */}}
{{- else }}
- {{ $value | toString | quote }}
{{- end }}
{{- end }}
{{- end }}
{{- end -}}

{{/* The admin sidecar's flags: listen on the pod address, tokens from the Secret, TLS or plaintext. */}}
{{- define "dspark.adminArgs" -}}
{{- $a := .Values.admin -}}
- --admin-port
- {{ $a.port | quote }}
- --admin-host
- {{ .Values.listenAddress | quote }}
{{- range $a.tokens.admins }}
- --admin-token-file
- /etc/dspark/admin-tokens/{{ . }}
{{- end }}
{{- range $a.tokens.readers }}
- --reader-token-file
- /etc/dspark/admin-tokens/{{ . }}
{{- end }}
{{- if $a.tls.secretName }}
- --admin-tls-cert
- /etc/dspark/admin-tls/tls.crt
- --admin-tls-key
- /etc/dspark/admin-tls/tls.key
{{- if $a.tls.requireClientCert }}
- --admin-tls-client-ca
- /etc/dspark/admin-tls/ca.crt
{{- end }}
{{- else }}
{{- /* plaintext beyond loopback: the NetworkPolicy decides who reaches the port */}}
- --admin-insecure
{{- end }}
- --admin-update-rate
- {{ $a.updateRate | toString | quote }}
- --admin-update-burst
- {{ $a.updateBurst | quote }}
{{- if $a.metricsPort }}
- --admin-metrics-port
- {{ $a.metricsPort | quote }}
{{- end }}
{{- end -}}

{{/* Where the capture volume is mounted (capture.*): `dspark serve --capture` writes to its folder `records`, made
     by the pod's user (an emptyDir's or a claim's root is not that user's own). */}}
{{- define "dspark.captureMount" -}}
/var/lib/dspark/capture
{{- end -}}

{{/* The serving container's arguments to `dspark serve`; .worker: an LWS worker (no admin sidecar). */}}
{{- define "dspark.serveArgs" -}}
{{- $root := .root -}}
{{- $v := $root.Values -}}
- --target
- {{ include "dspark.modelPath" (dict "m" $v.target "role" "target") }}
- --drafter
- {{ include "dspark.modelPath" (dict "m" $v.drafter "role" "drafter") }}
- --host
- {{ $v.listenAddress | quote }}
- --port
- {{ $v.http.port | quote }}
- --device
- {{ ternary "cuda" "cpu" (gt (int $v.gpu.count) 0) }}
- --drain-timeout
- {{ max 1 (sub (sub (int (include "dspark.gracePeriod" $root)) (int $v.scheduling.preStopSleepSeconds)) 10) | quote }}
{{- include "dspark.settingsArgs" $v.requestLimits }}
{{- include "dspark.settingsArgs" $v.liveness }}
{{- if and $v.capture.enabled (not .worker) }}
- --capture
- {{ include "dspark.captureMount" $root }}/records
{{- include "dspark.settingsArgs" (omit $v.capture "enabled" "volume") }}
{{- end }}
{{- include "dspark.settingsArgs" $v.settings }}
{{- if not $v.monitoring.metrics }}
{{- if or (ne $v.monitoring.kind "none") (ne $v.autoscaling.kind "none") }}
{{- fail (printf "monitoring.metrics is false, but monitoring.kind (%s) or autoscaling.kind (%s) reads the metrics: turn them back on or set both to none" $v.monitoring.kind $v.autoscaling.kind) }}
{{- end }}
- --no-metrics
{{- end }}
{{- if and $v.admin.enabled (not .worker) }}
{{ include "dspark.adminArgs" $root }}
{{- end }}
{{- if and $v.http.apiKey.enabled (not .worker) }}
{{- range required "http.apiKey.keys must name at least one key of the Secret when http.apiKey.enabled" $v.http.apiKey.keys }}
- --api-key-file
- /etc/dspark/api-keys/{{ . }}
{{- end }}
{{- end }}
{{- if $v.tracing.otlpEndpoint }}
- --otlp-endpoint
- {{ $v.tracing.otlpEndpoint | quote }}
- --otlp-protocol
- {{ $v.tracing.protocol | quote }}
- --otlp-service-name
- {{ $v.tracing.serviceName | default (include "dspark.fullname" $root) | quote }}
{{- end }}
- --
{{- include "dspark.sglangArgs" $root }}
{{- end -}}

{{/* SGLang's arguments: the ones the chart derives, then the user's sglangArgs (which may not set a derived one).
     Under LWS, SGLang's multi-node tensor parallelism: TP over every GPU of the group (gpu.count x lws.size), the
     group's size as the node count, and the leader's address and this pod's index from LWS's environment (the
     kubelet expands $(VAR) from the variables LWS adds to every pod of a group). */}}
{{- define "dspark.sglangArgs" -}}
{{- $v := .Values -}}
{{- $derived := list "--model-path" "--host" "--port" -}}
{{- if $v.lws.enabled }}
{{- if lt (int $v.gpu.count) 1 }}
{{- fail (printf "lws.enabled needs gpu.count >= 1 (got %v): multi-node tensor parallelism runs on GPUs" $v.gpu.count) }}
{{- end }}
{{- $derived = concat $derived (list "--tp-size" "--tp" "--tensor-parallel-size" "--dist-init-addr" "--nccl-init-addr" "--nnodes" "--node-rank") }}
- --tp-size
- {{ mul (int $v.gpu.count) (int $v.lws.size) | quote }}
- --dist-init-addr
- $(LWS_LEADER_ADDRESS):{{ $v.lws.distPort }}
- --nnodes
- $(LWS_GROUP_SIZE)
- --node-rank
- $(LWS_WORKER_INDEX)
{{- end }}
{{- range $v.sglangArgs }}
{{- if has (regexReplaceAll "=.*" . "") (list "--api-key" "--admin-api-key") }}
{{- fail (printf "sglangArgs sets %s: a key there sits in plain text in the pod spec (and in Git). Use http.apiKey (keys from a Secret, mounted as files); the admin key is the admin tokens' (admin.tokens)" (regexReplaceAll "=.*" . "")) }}
{{- end }}
{{- if has (regexReplaceAll "=.*" . "") $derived }}
{{- fail (printf "sglangArgs sets %s, which the chart derives (--tp-size, --nnodes, --node-rank and --dist-init-addr from gpu.count x lws.size and LWS under lws.enabled; the model, host and port from target, listenAddress and http.port): remove it from sglangArgs" .) }}
{{- end }}
- {{ . | quote }}
{{- end }}
{{- end -}}

{{/* The serving pods' metadata (Deployment, LWS leader, LWS worker; .component: server or worker): the chart's
     labels and podLabels, podAnnotations, and a checksum of the runtime settings and request limits (they reach
     the pods as arguments; the annotation says which ones a pod started with). */}}
{{- define "dspark.podMetadata" -}}
{{- $v := .root.Values -}}
labels:
  {{- include "dspark.podLabels" . | nindent 2 }}
  {{- if eq .component "server" }}
  # what the Gateway API Inference Extension's endpoint picker reads to know the engine (inferencePool)
  inference.networking.k8s.io/engine-type: sglang
  {{- end }}
  {{- with $v.podLabels }}
  {{- toYaml . | nindent 2 }}
  {{- end }}
annotations:
  dspark.dev/settings-checksum: {{ dict "settings" $v.settings "requestLimits" $v.requestLimits "liveness" $v.liveness | toJson | sha256sum }}
  {{- with $v.podAnnotations }}
  {{- toYaml . | nindent 2 }}
  {{- end }}
{{- end -}}

{{/* The pod's grace period: scheduling.terminationGracePeriodSeconds, raised to the preStop sleep + 10 s + the
time the longest request (requestLimits.max_new_tokens) takes at scheduling.minDecodeTokensPerSecond. */}}
{{- define "dspark.gracePeriod" -}}
{{- $s := .Values.scheduling -}}
{{- $grace := int $s.terminationGracePeriodSeconds -}}
{{- with .Values.requestLimits.max_new_tokens -}}
{{- $grace = max $grace (add (int $s.preStopSleepSeconds) 10 (ceil (divf . $s.minDecodeTokensPerSecond))) -}}
{{- end -}}
{{ $grace }}
{{- end -}}

{{/* Least privilege for every container; writable paths are emptyDir mounts. The one exception: the serving
     container of an LWS group with lws.network.ipcLock (called with a dict holding addCapabilities). */}}
{{- define "dspark.containerSecurityContext" -}}
allowPrivilegeEscalation: false
readOnlyRootFilesystem: true
runAsNonRoot: true
capabilities:
  drop: [ALL]
  {{- if and (kindIs "map" .) (hasKey . "addCapabilities") }}
  add: {{ .addCapabilities | toJson }}
  {{- end }}
seccompProfile:
  type: RuntimeDefault
{{- end -}}

{{- define "dspark.podSecurityContext" -}}
runAsNonRoot: true
runAsUser: {{ .Values.podSecurityContext.runAsUser }}
runAsGroup: {{ .Values.podSecurityContext.runAsUser }}
fsGroup: {{ .Values.podSecurityContext.fsGroup }}
seccompProfile:
  type: RuntimeDefault
{{- end -}}

{{/* Where the helper pods (the token Job, the `helm test` pods) run: the serving pods' nodeSelector and
     tolerations (the image is there already, and on a cluster of tainted GPU nodes nothing else would schedule them),
     and the pull secrets of the image they run. */}}
{{- define "dspark.helperPlacement" -}}
{{- with .Values.scheduling.nodeSelector }}
nodeSelector:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- with .Values.scheduling.tolerations }}
tolerations:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- with .Values.imagePullSecrets }}
imagePullSecrets:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- end -}}

{{/* Scheduling fields shared by every pod that must land on a GPU node. */}}
{{- define "dspark.scheduling" -}}
{{- $s := .Values.scheduling -}}
{{- with $s.nodeSelector }}
nodeSelector:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- with $s.affinity }}
affinity:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- with $s.tolerations }}
tolerations:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- with $s.topologySpreadConstraints }}
topologySpreadConstraints:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- with $s.runtimeClassName }}
runtimeClassName: {{ . }}
{{- end }}
{{- with $s.priorityClassName }}
priorityClassName: {{ . }}
{{- end }}
{{- with $s.schedulerName }}
schedulerName: {{ . }}
{{- end }}
{{- end -}}

{{/* A container's resources; .root and .resources (requests, limits), plus the accelerator when .gpu; quantities
     quoted (server-side apply on 1.20 rejects a bare number for an extended resource). */}}
{{- define "dspark.resources" -}}
{{- $v := .root.Values -}}
{{- $requests := deepCopy (.resources.requests | default dict) -}}
{{- $limits := deepCopy (.resources.limits | default dict) -}}
{{- if and .gpu (gt (int $v.gpu.count) 0) -}}
{{- $_ := set $requests $v.gpu.resourceName ($v.gpu.count | toString) -}}
{{- $_ := set $limits $v.gpu.resourceName ($v.gpu.count | toString) -}}
{{- end -}}
{{- if and .gpu $v.lws.enabled -}}{{/* RDMA devices (lws.network.resources), requested as they are limited */}}
{{- range $name, $quantity := $v.lws.network.resources -}}
{{- $_ := set $requests $name ($quantity | toString) -}}
{{- $_ := set $limits $name ($quantity | toString) -}}
{{- end -}}
{{- end -}}
{{- with .ephemeral -}}{{/* requested, never limited: the emptyDirs' sizeLimits evict a pod that outgrows them */}}
{{- $_ := set $requests "ephemeral-storage" . -}}
{{- end -}}
{{- with $requests -}}
requests:
  {{- range $k, $q := . }}
  {{ $k }}: {{ $q | toString | quote }}
  {{- end }}
{{- end }}
{{- with $limits }}
limits:
  {{- range $k, $q := . }}
  {{ $k }}: {{ $q | toString | quote }}
  {{- end }}
{{- end }}
{{- end -}}
