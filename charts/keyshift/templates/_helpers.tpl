{{/* The chart's name, cut to fit a label. */}}
{{- define "keyshift.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 40 | trimSuffix "-" -}}
{{- end -}}

{{/* The prefix of every object's name: the release, and the chart's name unless the
release's name already says it. */}}
{{- define "keyshift.fullname" -}}
{{- if .Values.fullnameOverride -}}
{{- .Values.fullnameOverride | trunc 40 | trimSuffix "-" -}}
{{- else -}}
{{- $name := default .Chart.Name .Values.nameOverride -}}
{{- if contains $name .Release.Name -}}
{{- .Release.Name | trunc 40 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name $name | trunc 40 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}
{{- end -}}

{{/* Labels of every object, with its selector labels after them (or the instance). */}}
{{- define "keyshift.commonLabels" -}}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/part-of: keyshift
{{- end -}}

{{- define "keyshift.labels" -}}
{{ include "keyshift.commonLabels" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end -}}

{{/* The operator's selector labels (tests/e2e/harness.py finds its pods by the name). */}}
{{- define "keyshift.operator.selector" -}}
app.kubernetes.io/name: keyshift-operator
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end -}}

{{- define "keyshift.operator.fullname" -}}
{{- printf "%s-operator" (include "keyshift.fullname" .) -}}
{{- end -}}

{{- define "keyshift.serviceAccountName" -}}
{{- if .Values.serviceAccount.create -}}
{{- default (include "keyshift.operator.fullname" .) .Values.serviceAccount.name -}}
{{- else -}}
{{- required "serviceAccount.name is required when serviceAccount.create is false" .Values.serviceAccount.name -}}
{{- end -}}
{{- end -}}

{{- define "keyshift.image" -}}
{{- printf "%s:%s" .Values.image.repository (default .Chart.AppVersion .Values.image.tag) -}}
{{- end -}}

{{/* The namespaces the operator watches (scope namespace), as a list. */}}
{{- define "keyshift.watchedNamespaces" -}}
{{- $namespaces := .Values.operator.namespaces | default (list .Release.Namespace) -}}
{{- toJson $namespaces -}}
{{- end -}}

{{/* Where the store's Secret goes: the release's namespace (the store reads it there)
and, in scope namespace, each watched namespace (a StreamJob's secretRef is local). */}}
{{- define "keyshift.secretNamespaces" -}}
{{- $namespaces := list .Release.Namespace -}}
{{- if eq .Values.operator.scope "namespace" -}}
{{- $namespaces = concat $namespaces (include "keyshift.watchedNamespaces" . | fromJsonArray) -}}
{{- end -}}
{{- toJson ($namespaces | uniq) -}}
{{- end -}}

{{/* The peering object's name when more than one replica runs. */}}
{{- define "keyshift.peeringName" -}}
{{- include "keyshift.fullname" . -}}
{{- end -}}

{{/* ---------------------------------------------------------------- the store */}}

{{- define "keyshift.store.fullname" -}}
{{- printf "%s-valkey" (include "keyshift.fullname" .) -}}
{{- end -}}

{{- define "keyshift.store.selector" -}}
app.kubernetes.io/name: keyshift-valkey
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end -}}

{{/* The cluster-init Job's pods (the store's NetworkPolicy admits them). */}}
{{- define "keyshift.store.initSelector" -}}
app.kubernetes.io/name: keyshift-valkey-init
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end -}}

{{/* Whether the managed store speaks TLS ("true" or ""). */}}
{{- define "keyshift.store.tls" -}}
{{- $managed := .Values.stateStore.managed -}}
{{- if and $managed.enabled $managed.tls.enabled -}}
true
{{- end -}}
{{- end -}}

{{/* The managed store's kubernetes.io/tls Secret: yours, or the one the chart makes. */}}
{{- define "keyshift.store.tlsSecretName" -}}
{{- default (printf "%s-tls" (include "keyshift.store.fullname" .)) .Values.stateStore.managed.tls.existingSecret -}}
{{- end -}}

{{/* Where the store's containers find the password (a file of the store's Secret) and,
with TLS, the certificate, key and CA. */}}
{{- define "keyshift.store.authDir" -}}/run/secrets/valkey{{- end -}}
{{- define "keyshift.store.tlsDir" -}}/run/valkey/tls{{- end -}}

{{/* Servers of the managed store: 1, or masters * (1 + replicas). */}}
{{- define "keyshift.store.servers" -}}
{{- $store := .Values.stateStore.managed -}}
{{- if eq $store.mode "cluster" -}}
{{- mul $store.cluster.masters (add1 $store.cluster.replicasPerMaster) -}}
{{- else -}}
1
{{- end -}}
{{- end -}}

{{/* The name of the Secret StreamJobs name in spec.stateStore.secretRef ("" when the
store has no password). */}}
{{- define "keyshift.store.secretName" -}}
{{- $managed := .Values.stateStore.managed -}}
{{- $external := .Values.stateStore.external -}}
{{- if $managed.enabled -}}
{{- default (printf "%s-store" (include "keyshift.fullname" .)) $managed.auth.existingSecret -}}
{{- else if $external.enabled -}}
{{- if $external.existingSecret -}}
{{- $external.existingSecret -}}
{{- else if $external.password -}}
{{- printf "%s-store" (include "keyshift.fullname" .) -}}
{{- end -}}
{{- end -}}
{{- end -}}

{{/* Whether the chart makes the store's Secret itself. */}}
{{- define "keyshift.store.makesSecret" -}}
{{- $managed := .Values.stateStore.managed -}}
{{- $external := .Values.stateStore.external -}}
{{- if and $managed.enabled (not $managed.auth.existingSecret) -}}
true
{{- else if and $external.enabled (not $external.existingSecret) $external.password -}}
true
{{- end -}}
{{- end -}}

{{/* The URL StreamJobs put in spec.stateStore.url. */}}
{{- define "keyshift.store.url" -}}
{{- $managed := .Values.stateStore.managed -}}
{{- if $managed.enabled -}}
{{- $name := include "keyshift.store.fullname" . -}}
{{- $domain := printf "%s.svc" .Release.Namespace -}}
{{- $scheme := ternary "rediss" "redis" (eq (include "keyshift.store.tls" .) "true") -}}
{{- if eq $managed.mode "cluster" -}}
{{- $seeds := list -}}
{{- range $i := until (int $managed.cluster.masters) -}}
{{- $seeds = append $seeds (printf "%s-%d.%s-headless.%s:6379" $name $i $name $domain) -}}
{{- end -}}
{{- printf "%s+cluster://%s" $scheme (join "," $seeds) -}}
{{- else -}}
{{- printf "%s://%s.%s:6379" $scheme $name $domain -}}
{{- end -}}
{{- else if .Values.stateStore.external.enabled -}}
{{- .Values.stateStore.external.url -}}
{{- end -}}
{{- end -}}

{{/* Checks across values that the schema cannot express. */}}
{{- define "keyshift.validate" -}}
{{- if and .Values.stateStore.managed.enabled .Values.stateStore.external.enabled -}}
{{- fail "stateStore: enable either managed or external, not both" -}}
{{- end -}}
{{- if and .Values.stateStore.external.enabled .Values.stateStore.external.existingSecret .Values.stateStore.external.password -}}
{{- fail "stateStore.external: give either existingSecret or password, not both" -}}
{{- end -}}
{{- if and .Values.stateStore.managed.auth.existingSecret .Values.stateStore.managed.auth.password -}}
{{- fail "stateStore.managed.auth: give either existingSecret or password, not both" -}}
{{- end -}}
{{- if and (eq .Values.operator.scope "cluster") .Values.operator.namespaces -}}
{{- fail "operator.namespaces is for scope namespace: with scope cluster the operator watches every namespace" -}}
{{- end -}}
{{- end -}}

{{/* The restricted Pod Security Standard, for a container. */}}
{{- define "keyshift.containerSecurityContext" -}}
allowPrivilegeEscalation: false
readOnlyRootFilesystem: true
runAsNonRoot: true
capabilities:
  drop: ["ALL"]
seccompProfile:
  type: RuntimeDefault
{{- end -}}

{{/* imagePullSecrets of the chart's pods: values' names (`regcred`) or LocalObjectReferences
(`{name: regcred}`), both as Kubernetes has them. */}}
{{- define "keyshift.imagePullSecrets" -}}
{{- range .Values.imagePullSecrets }}
- name: {{ if kindIs "string" . }}{{ . }}{{ else }}{{ .name }}{{ end }}
{{- end }}
{{- end -}}
