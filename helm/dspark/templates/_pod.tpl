{{/* The serving pod, shared by the Deployment and the LeaderWorkerSet's leader and workers.
     Called with (dict "root" $ "worker" bool). */}}
{{- define "dspark.podSpec" -}}
{{- $root := .root -}}
{{- $v := $root.Values -}}
{{- $fullname := include "dspark.fullname" $root -}}
serviceAccountName: {{ $fullname }}
automountServiceAccountToken: false  # the servers never call the Kubernetes API
enableServiceLinks: false  # no *_PORT / *_SERVICE_HOST variables of every Service (SGLang reads SGLANG_*)
securityContext:
  {{- include "dspark.podSecurityContext" $root | nindent 2 }}
terminationGracePeriodSeconds: {{ include "dspark.gracePeriod" $root }}
{{- include "dspark.scheduling" $root }}
{{- with $v.imagePullSecrets }}
imagePullSecrets:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- with include "dspark.fetchContainers" (dict "root" $root "roles" (list "target" "drafter")) | trim }}
initContainers:
  {{- . | nindent 2 }}
{{- end }}
containers:
  - name: dspark
    image: {{ include "dspark.image" $root }}
    imagePullPolicy: {{ $v.image.pullPolicy }}
    command: [dspark, serve]
    args:
      {{- include "dspark.serveArgs" . | nindent 6 }}
    env:
      - {name: DSPARK_CACHE, value: /var/cache/dspark}
      {{- if $v.spsProfile.enabled }}
      # where a live sps_table may be (models/decoding/sps_paths.py): the writable cache first, then the Job's table
      - {name: DSPARK_SPS_DIR, value: "/var/cache/dspark/sps:/etc/dspark/sps"}
      {{- end }}
      - {name: HOME, value: /home/dspark}
      - name: SGLANG_HEALTH_CHECK_TIMEOUT
        value: {{ $v.probes.healthCheckTimeoutSeconds | quote }}
      # /health answers without generating (the liveness check); /health_generate still generates (readiness)
      - {name: SGLANG_ENABLE_HEALTH_ENDPOINT_GENERATION, value: "false"}
      {{- if $v.tracing.otlpEndpoint }}
      - {name: OTEL_TRACES_SAMPLER, value: {{ $v.tracing.sampler | quote }}}
      - {name: OTEL_TRACES_SAMPLER_ARG, value: {{ $v.tracing.samplerArg | quote }}}
      {{- end }}
      {{- with $v.extraEnv }}
      {{- toYaml . | nindent 6 }}
      {{- end }}
    {{- if gt (int $v.scheduling.preStopSleepSeconds) 0 }}
    lifecycle:
      preStop:
        exec: {command: [sleep, {{ $v.scheduling.preStopSleepSeconds | quote }}]}
    {{- end }}
    ports:
      - {name: http, containerPort: {{ $v.http.port }}, protocol: TCP}
      {{- if and $v.admin.enabled (not .worker) }}
      - {name: admin, containerPort: {{ $v.admin.port }}, protocol: TCP}
      {{- if $v.admin.metricsPort }}
      - {name: admin-metrics, containerPort: {{ $v.admin.metricsPort }}, protocol: TCP}
      {{- end }}
      {{- end }}
    {{- if not .worker }}
    startupProbe:
      httpGet: {path: /health, port: http}
      periodSeconds: {{ $v.probes.startup.periodSeconds }}
      failureThreshold: {{ $v.probes.startup.failureThreshold }}
    readinessProbe:
      httpGet: {path: /health_generate, port: http}
      periodSeconds: {{ $v.probes.readiness.periodSeconds }}
      {{- if le (int $v.probes.readiness.timeoutSeconds) (int $v.probes.healthCheckTimeoutSeconds) }}
      {{- fail (printf "probes.readiness.timeoutSeconds (%v) must exceed probes.healthCheckTimeoutSeconds (%v): /health_generate waits that long before it answers" $v.probes.readiness.timeoutSeconds $v.probes.healthCheckTimeoutSeconds) }}
      {{- end }}
      timeoutSeconds: {{ $v.probes.readiness.timeoutSeconds }}
      failureThreshold: {{ $v.probes.readiness.failureThreshold }}
    livenessProbe:
      httpGet: {path: /liveness, port: http}
      periodSeconds: {{ $v.probes.liveness.periodSeconds }}
      timeoutSeconds: {{ $v.probes.liveness.timeoutSeconds }}
      failureThreshold: {{ $v.probes.liveness.failureThreshold }}
    {{- end }}
    {{- $hubDir := and (include "dspark.hubRoles" (dict "root" $root "roles" (list "target" "drafter"))) (eq (include "dspark.hubCacheVolume" $root) "emptyDir") }}
    {{- with include "dspark.resources" (dict "root" $root "resources" $v.resources "gpu" true "ephemeral" (include "dspark.ephemeralStorage" (dict "root" $root "hubCache" $hubDir "capture" (not .worker)))) }}
    resources:
      {{- . | nindent 6 }}
    {{- end }}
    securityContext:
      {{- if and $v.lws.enabled $v.lws.network.ipcLock }}
      {{- /* the scoped exception (docs/deploy.md): NCCL over InfiniBand pins memory */}}
      {{- include "dspark.containerSecurityContext" (dict "addCapabilities" (list "IPC_LOCK")) | nindent 6 }}
      {{- else }}
      {{- include "dspark.containerSecurityContext" $root | nindent 6 }}
      {{- end }}
    terminationMessagePolicy: FallbackToLogsOnError
    volumeMounts:
      - {name: shm, mountPath: /dev/shm}
      - {name: cache, mountPath: /var/cache/dspark}
      - {name: home, mountPath: /home/dspark}
      - {name: tmp, mountPath: /tmp}
      {{- with include "dspark.modelMounts" (dict "root" $root "roles" (list "target" "drafter")) | trim }}
      {{- . | nindent 6 }}
      {{- end }}
      {{- if $v.spsProfile.enabled }}
      - {name: sps, mountPath: /etc/dspark/sps/sglang, readOnly: true}  # where a start looks for its table
      {{- end }}
      {{- if $v.lws.enabled }}
      {{- with $v.lws.network.extraVolumeMounts }}
      {{- toYaml . | nindent 6 }}
      {{- end }}
      {{- end }}
      {{- if and $v.http.apiKey.enabled (not .worker) }}
      - {name: api-keys, mountPath: /etc/dspark/api-keys, readOnly: true}
      {{- end }}
      {{- if and $v.capture.enabled (not .worker) }}
      - {name: capture, mountPath: {{ include "dspark.captureMount" $root }}}
      {{- end }}
      {{- if and $v.admin.enabled (not .worker) }}
      - {name: admin-tokens, mountPath: /etc/dspark/admin-tokens, readOnly: true}
      {{- if $v.admin.tls.secretName }}
      - {name: admin-tls, mountPath: /etc/dspark/admin-tls, readOnly: true}
      {{- end }}
      {{- end }}
volumes:
  # always memory-backed and sized: NCCL and SGLang's IPC outgrow the runtime's 64 MiB default
  - name: shm
    emptyDir: {medium: Memory, sizeLimit: {{ $v.shmSize }}}
  # writable paths under a read-only root: dspark's cache (SGLang's admin-key config, SPS profiles, audit log),
  # HOME (torch, Triton and FlashInfer JIT caches) and /tmp
  - {name: cache, emptyDir: {sizeLimit: {{ $v.scratchSize }}}}
  - {name: home, emptyDir: {sizeLimit: {{ $v.scratchSize }}}}
  - {name: tmp, emptyDir: {sizeLimit: {{ $v.scratchSize }}}}
  {{- with include "dspark.modelVolumes" (dict "root" $root "roles" (list "target" "drafter") "claim" (eq (include "dspark.hubCacheVolume" $root) "claim")) | trim }}
  {{- . | nindent 2 }}
  {{- end }}
  {{- if $v.lws.enabled }}
  {{- with $v.lws.network.extraVolumes }}
  {{- toYaml . | nindent 2 }}
  {{- end }}
  {{- end }}
  {{- if and $v.http.apiKey.enabled (not .worker) }}
  # the API keys `dspark serve --api-key-file` reads (never in args); generated once unless http.apiKey.existingSecret
  - name: api-keys
    secret:
      secretName: {{ include "dspark.apiKeysSecret" $root }}
      defaultMode: 0440
  {{- end }}
  {{- if and $v.capture.enabled (not .worker) }}
  # captured traffic (capture.*): an existing claim, or an emptyDir gone with the pod
  - name: capture
    {{- if $v.capture.volume.existingClaim }}
    persistentVolumeClaim: {claimName: {{ $v.capture.volume.existingClaim | quote }}}
    {{- else }}
    emptyDir: {sizeLimit: {{ $v.capture.volume.sizeLimit }}}
    {{- end }}
  {{- end }}
  {{- if and $v.admin.enabled (not .worker) }}
  - name: admin-tokens
    secret:
      secretName: {{ include "dspark.adminTokensSecret" $root }}
      defaultMode: 0440  # readable by the pod's fsGroup only
  {{- if $v.admin.tls.secretName }}
  - name: admin-tls
    secret: {secretName: {{ $v.admin.tls.secretName }}, defaultMode: 0440}
  {{- end }}
  {{- end }}
  {{- if $v.spsProfile.enabled }}
  # the table the SPS Job profiled (job-sps-profile.yaml); optional: it appears once the Job has run
  - name: sps
    configMap: {name: {{ $fullname }}-sps, optional: true}
  {{- end }}
{{- end -}}

{{/* Hugging Face downloads: the token (when given) and the cache's metadata beside the models. */}}
{{- define "dspark.hubEnv" -}}
- {name: HF_HOME, value: /models/hub/.hf}
{{- if .Values.hub.caBundle.configMap }}
# the CA bundle (hub.caBundle) for every TLS client a download uses: httpx, requests, curl, the AWS SDK
{{- range list "SSL_CERT_FILE" "REQUESTS_CA_BUNDLE" "CURL_CA_BUNDLE" "AWS_CA_BUNDLE" }}
- {name: {{ . }}, value: /etc/dspark/ca/{{ $.Values.hub.caBundle.key }}}
{{- end }}
{{- end }}
{{- if .Values.hub.tokenSecret }}
- name: HF_TOKEN
  valueFrom:
    secretKeyRef: {name: {{ .Values.hub.tokenSecret }}, key: {{ .Values.hub.tokenKey }}}
{{- end }}
{{- end -}}

{{/* The models' hub downloads, mounts and volumes for the roles in .roles ("target", "drafter"): the serving
     pod needs both models, the SPS Job only the target. */}}
{{/* The roles downloaded into the hub cache: from the Hugging Face hub, or from S3/GCS-compatible object storage. */}}
{{- define "dspark.hubRoles" -}}
{{- range .roles }}{{ if has (index $.root.Values .).source (list "hub" "s3") }}{{ . }} {{ end }}{{ end -}}
{{- end -}}

{{- define "dspark.fetchContainers" -}}
{{- $root := .root -}}
{{- $v := $root.Values -}}
{{- range $role := .roles }}
{{- $m := index $v $role }}
{{- if has $m.source (list "hub" "s3") }}
- name: fetch-{{ $role }}
  {{- if eq $m.source "hub" }}
  image: {{ include "dspark.image" $root }}
  imagePullPolicy: {{ $v.image.pullPolicy }}
  # huggingface_hub's CLI: resumes a partial download and skips files already in the cache; stopped after
  # hub.download.timeoutSeconds (the kubelet then starts it again, resuming)
  command: [timeout, {{ $v.hub.download.timeoutSeconds | quote }}, hf, download]
  args:
    - {{ $m.hubId | quote }}
    - --revision
    - {{ $m.revision | quote }}
    - --local-dir
    - {{ include "dspark.modelPath" (dict "m" $m "role" $role) }}
  {{- else }}
  {{- $s3 := $v.hub.objectStore }}
  image: {{ $s3.image }}
  imagePullPolicy: IfNotPresent
  # the AWS CLI: `s3 sync` copies only what is missing or changed, so a restarted download resumes; GCS through its
  # S3-compatible XML API (hub.objectStore.endpointUrl https://storage.googleapis.com, HMAC keys)
  command: [timeout, {{ $v.hub.download.timeoutSeconds | quote }}, aws, s3, sync, --only-show-errors, --no-progress]
  args:
    {{- with $s3.endpointUrl }}
    - --endpoint-url
    - {{ . | quote }}
    {{- end }}
    - {{ required (printf "%s.uri is required when %s.source is s3" $role $role) $m.uri | quote }}
    - {{ include "dspark.modelPath" (dict "m" $m "role" $role) }}
  {{- end }}
  env:
    {{- include "dspark.hubEnv" $root | nindent 4 }}
    {{- if eq $m.source "s3" }}
    - {name: HOME, value: /home/dspark}
    {{- with $v.hub.objectStore.region }}
    - {name: AWS_DEFAULT_REGION, value: {{ . | quote }}}
    {{- end }}
    {{- with $v.hub.objectStore.credentialsSecret }}
    - name: AWS_ACCESS_KEY_ID
      valueFrom: {secretKeyRef: {name: {{ . }}, key: AWS_ACCESS_KEY_ID}}
    - name: AWS_SECRET_ACCESS_KEY
      valueFrom: {secretKeyRef: {name: {{ . }}, key: AWS_SECRET_ACCESS_KEY}}
    {{- end }}
    {{- end }}
    {{- with $v.extraEnv }}{{/* a hub mirror (HF_ENDPOINT), a proxy: whatever the serving container gets */}}
    {{- toYaml . | nindent 4 }}
    {{- end }}
  resources:
    {{- include "dspark.resources" (dict "root" $root "resources" $v.helperResources) | nindent 4 }}
  securityContext:
    {{- include "dspark.containerSecurityContext" $root | nindent 4 }}
  volumeMounts:
    - {name: hub-cache, mountPath: /models/hub}
    - {name: home, mountPath: /home/dspark}
    - {name: tmp, mountPath: /tmp}
    {{- if $v.hub.caBundle.configMap }}
    - {name: ca-bundle, mountPath: /etc/dspark/ca, readOnly: true}
    {{- end }}
{{- end }}
{{- end }}
{{- end -}}

{{/* A pvc model's directory is mounted at /models/<role> through a subPath of its claim's one volume
     (dspark.claimVolume): a pod that names one claim in two volumes never starts (kubernetes/kubernetes#127004). */}}
{{- define "dspark.modelMounts" -}}
{{- $v := .root.Values -}}
{{- if include "dspark.hubRoles" . }}
- {name: hub-cache, mountPath: /models/hub, readOnly: true}
{{- end }}
{{- range $role := .roles }}
{{- $m := index $v $role }}
{{- if eq $m.source "pvc" }}
- name: {{ include "dspark.claimVolume" (dict "root" $.root "roles" $.roles "role" $role) }}
  mountPath: /models/{{ $role }}
  {{- with $m.path | trimPrefix "/" | trimSuffix "/" }}
  subPath: {{ . }}
  {{- end }}
  readOnly: true
{{- else if eq $m.source "oci" }}
- name: {{ $role }}-oci
  mountPath: /models/{{ $role }}
  {{- with $m.path | trimPrefix "/" | trimSuffix "/" }}
  subPath: {{ . }}
  {{- end }}
  readOnly: true
{{- end }}
{{- end }}
{{- end -}}

{{/* The volume that holds .role's claim: named after the first role in .roles on that claim, so target and
     drafter on one claim share one volume. */}}
{{- define "dspark.claimVolume" -}}
{{- $v := .root.Values -}}
{{- $claim := (index $v .role).claimName -}}
{{- $first := "" -}}
{{- range .roles }}{{ if and (not $first) (eq (index $v .).source "pvc") (eq (index $v .).claimName $claim) }}{{ $first = . }}{{ end }}{{ end -}}
{{ $first }}-model
{{- end -}}

{{/* .claim: the hub cache is the claim (dspark.hubCacheVolume), else a download per pod into an emptyDir. */}}
{{- define "dspark.modelVolumes" -}}
{{- $v := .root.Values -}}
{{- if include "dspark.hubRoles" . }}
- name: hub-cache
  {{- if .claim }}
  persistentVolumeClaim: {claimName: {{ include "dspark.hubCacheClaim" .root }}}
  {{- else }}
  emptyDir: {sizeLimit: {{ $v.hub.cache.size }}}
  {{- end }}
{{- if $v.hub.caBundle.configMap }}
- name: ca-bundle
  configMap: {name: {{ $v.hub.caBundle.configMap }}, items: [{key: {{ $v.hub.caBundle.key }}, path: {{ $v.hub.caBundle.key }}}]}
{{- end }}
{{- end }}
{{- range $role := .roles }}
{{- $m := index $v $role }}
{{- if and (eq $m.source "pvc") (eq (include "dspark.claimVolume" (dict "root" $.root "roles" $.roles "role" $role)) (printf "%s-model" $role)) }}
- name: {{ $role }}-model
  persistentVolumeClaim:
    claimName: {{ required (printf "%s.claimName is required when %s.source is pvc" $role $role) $m.claimName }}
    readOnly: true
{{- else if eq $m.source "oci" }}
{{- if semverCompare "<1.33-0" $.root.Capabilities.KubeVersion.Version }}
{{- fail (printf "%s.source=oci needs image volumes with subPath (Kubernetes >= 1.33; on by default from 1.35, GA in 1.36); this cluster is %s" $role $.root.Capabilities.KubeVersion.Version) }}
{{- end }}
# the model as an OCI artifact or image, pulled by the kubelet like the container image (no download container)
- name: {{ $role }}-oci
  image:
    reference: {{ required (printf "%s.reference is required when %s.source is oci" $role $role) $m.reference }}
    pullPolicy: IfNotPresent
{{- end }}
{{- end }}
{{- end -}}
