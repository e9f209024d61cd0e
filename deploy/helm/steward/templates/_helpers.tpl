{{/* Chart name, truncated to a DNS label. */}}
{{- define "steward.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{/* Prefix of every object name. */}}
{{- define "steward.fullname" -}}
{{- if .Values.fullnameOverride -}}
{{- .Values.fullnameOverride | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- $name := default .Chart.Name .Values.nameOverride -}}
{{- if contains $name .Release.Name -}}
{{- .Release.Name | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name $name | trunc 63 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}
{{- end -}}

{{/* Labels on every object; pass (dict "ctx" $ "component" "agent"). */}}
{{- define "steward.labels" -}}
helm.sh/chart: {{ printf "%s-%s" .ctx.Chart.Name .ctx.Chart.Version | replace "+" "_" }}
app.kubernetes.io/managed-by: {{ .ctx.Release.Service }}
app.kubernetes.io/version: {{ .ctx.Chart.AppVersion | quote }}
{{ include "steward.selectorLabels" . }}
{{- end -}}

{{- define "steward.selectorLabels" -}}
app.kubernetes.io/name: {{ include "steward.name" .ctx }}
app.kubernetes.io/instance: {{ .ctx.Release.Name }}
app.kubernetes.io/component: {{ .component }}
{{- end -}}

{{- define "steward.image" -}}
{{ printf "%s:%s" .Values.image.repository (default .Chart.AppVersion .Values.image.tag) }}
{{- end -}}

{{/* The hardened container securityContext; pass a list of capabilities to add. */}}
{{- define "steward.securityContext" -}}
runAsUser: 0
runAsNonRoot: false
allowPrivilegeEscalation: false
privileged: false
readOnlyRootFilesystem: true
capabilities:
  drop: [ALL]
  {{- if . }}
  add: {{ toJson . }}
  {{- end }}
seccompProfile:
  type: RuntimeDefault
{{- end -}}

{{/*
For a component that touches nothing of the node (the controller, the
extender): not root either. It reads no file but its own binary and binds
ports above 1024.
*/}}
{{- define "steward.nonRootSecurityContext" -}}
runAsUser: 65532
runAsGroup: 65532
runAsNonRoot: true
allowPrivilegeEscalation: false
privileged: false
readOnlyRootFilesystem: true
capabilities:
  drop: [ALL]
seccompProfile:
  type: RuntimeDefault
{{- end -}}

{{/*
The directory of discovery sockets: the agent's registration socket and each
handler DaemonSet's own socket. The only part of the state directory a
handler mounts (the agent's store and the resource manager's cache stay out
of its reach).
*/}}
{{- define "steward.discoveryDir" -}}
{{ .Values.stateDir }}/discovery
{{- end -}}

{{/* The agent's registration socket, where discovery handlers register. */}}
{{- define "steward.registrationSocket" -}}
{{ include "steward.discoveryDir" . }}/registration.sock
{{- end -}}

{{/* The resource manager's pod resources socket (either transport), followed by the agent. */}}
{{- define "steward.criPodResourcesSocket" -}}
{{ .Values.stateDir }}/resmgr/pod-resources.sock
{{- end -}}

{{/* The resource manager's component (and object name suffix): its transport's command. */}}
{{- define "steward.resourceManagerComponent" -}}
{{ ternary "nri-plugin" "cri-proxy" (eq .Values.resourceManager.transport "nri") }}
{{- end -}}

{{/*
The name of the controller's election Lease (in the release namespace),
which the extender follows to the leader for the direct path: the
controller's default --lease-name, or the one given as
`--lease-name=<name>` in controller.extraArgs.
*/}}
{{- define "steward.controllerLeaseName" -}}
{{- $name := "steward-controller" -}}
{{- range .Values.controller.extraArgs -}}
{{- if hasPrefix "--lease-name=" (toString .) -}}
{{- $name = trimPrefix "--lease-name=" (toString .) -}}
{{- end -}}
{{- end -}}
{{- $name -}}
{{- end -}}

{{/* "true" when the extender asks the leading controller directly: the controller runs in this release with controller.decide.enabled. Empty otherwise (the extender gets --no-direct). */}}
{{- define "steward.directPath" -}}
{{- if and .Values.controller.enabled .Values.controller.decide.enabled -}}
true
{{- end -}}
{{- end -}}
