{{/*
Names and labels as the Apache Pulsar chart makes them (charts/pulsar/templates/_helpers.tpl:
pulsar.name, pulsar.fullname, pulsar.standardLabels, pulsar.template.labels, pulsar.matchLabels),
so one label query (app, release, cluster, component) finds bkaudit next to the Pulsar pods.
*/}}
{{- define "bkaudit.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{- define "bkaudit.fullname" -}}
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

{{- define "bkaudit.chart" -}}
{{- printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" -}}
{{- end -}}

{{/* The Pulsar release's pulsar.fullname: its services are <this>-zookeeper, -bookie, -broker. */}}
{{- define "bkaudit.pulsarFullname" -}}
{{- $p := .Values.pulsar -}}
{{- if $p.fullnameOverride -}}
{{- $p.fullnameOverride | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- $name := default "pulsar" $p.nameOverride -}}
{{- if contains $name $p.release -}}
{{- $p.release | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" $p.release $name | trunc 63 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}
{{- end -}}

{{/* Pulsar's pulsar.cluster.name: its clusterName, else its fullname. */}}
{{- define "bkaudit.cluster" -}}
{{- .Values.pulsar.clusterName | default (include "bkaudit.pulsarFullname" .) -}}
{{- end -}}

{{/* The metadataServiceUri the Pulsar release's bookies read (pulsar.bookkeeper.config.common). */}}
{{- define "bkaudit.pulsarBookiesUri" -}}
{{- $port := ternary 2281 2181 (.Values.tls.zookeeper.enabled | default false) -}}
{{- printf "zk+hierarchical://%s-zookeeper:%d%s/ledgers" (include "bkaudit.pulsarFullname" .) (int $port) .Values.pulsar.metadataPrefix -}}
{{- end -}}

{{/*
metadata.labels: Pulsar's standard labels and `component` (argument `component`), then the
chart's `labels`; `extra` (a monitor's labels, e.g. release: <Prometheus release>) wins, so a
monitor may carry another `release` than its own without a duplicate key.
*/}}
{{- define "bkaudit.labels" -}}
{{- $root := .root -}}
{{- $labels := dict "app" (include "bkaudit.name" $root) "chart" (include "bkaudit.chart" $root) "release" $root.Release.Name "heritage" $root.Release.Service "cluster" (include "bkaudit.cluster" $root) -}}
{{- with .component }}{{ $_ := set $labels "component" . }}{{ end -}}
{{- toYaml (merge (deepCopy (.extra | default dict)) $labels (deepCopy ($root.Values.labels | default dict))) -}}
{{- end -}}

{{/* Pod template labels (Pulsar's pulsar.template.labels and `component`). */}}
{{- define "bkaudit.templateLabels" -}}
{{- $root := .root -}}
{{- $labels := dict "app" (include "bkaudit.name" $root) "release" $root.Release.Name "cluster" (include "bkaudit.cluster" $root) "component" .component -}}
{{- toYaml (merge $labels (deepCopy ($root.Values.labels | default dict))) -}}
{{- end -}}

{{/* Selectors (Pulsar's pulsar.matchLabels and `component`, when given). */}}
{{- define "bkaudit.matchLabels" -}}
app: {{ include "bkaudit.name" .root }}
release: {{ .root.Release.Name }}
{{- with .component }}
component: {{ . }}
{{- end }}
{{- end -}}

{{/*
A Prometheus operator object's labels: the standard ones plus monitoring.labels and the
object's own. Prometheus selects these objects by label (kube-prometheus-stack: release: <its
Helm release>), so an object with none of ours would be ignored without a word: refused here.
*/}}
{{- define "bkaudit.monitorLabels" -}}
{{- $extra := merge (deepCopy (.own | default dict)) (deepCopy (.root.Values.monitoring.labels | default dict)) -}}
{{- if not $extra -}}
{{- fail (printf "monitoring.labels is empty: Prometheus selects a %s by its labels (kube-prometheus-stack: release=<its Helm release>); set monitoring.labels.release=<that release>, or the labels your Prometheus selects" .kind) -}}
{{- end -}}
{{- include "bkaudit.labels" (dict "root" .root "component" "watch" "extra" $extra) -}}
{{- end -}}

{{- define "bkaudit.image" -}}
{{- printf "%s:%s" .repository (.tag | default $.appVersion) -}}
{{- end -}}

{{- define "bkaudit.sparkServiceAccount" -}}
{{- .Values.sparkAudit.serviceAccount.name | default (printf "%s-spark" (include "bkaudit.fullname" .)) -}}
{{- end -}}

{{/* Where secrets are mounted: one directory per Secret, files only. */}}
{{- define "bkaudit.secretsDir" -}}/etc/bkaudit/secrets{{- end -}}

{{/* "true" when the admin API is https and its CA is mounted. */}}
{{- define "bkaudit.adminCa" -}}
{{- if and (hasPrefix "https://" .Values.pulsarAdmin.url) (tpl .Values.pulsarAdmin.tls.caSecretName .) -}}true{{- end -}}
{{- end -}}

{{/*
The Secrets a bkaudit pod mounts, as YAML {mounts: [{name, secret, path, private}]}: one
place for the volumes, the mounts and the Spark executors' pod template. Secret names may
refer to the Pulsar release ("{{ .Values.pulsar.release }}-ca-tls"). One volume per path: two
uses of one path (the Pulsar chart's single /pulsar/certs/ca) must name one Secret.
*/}}
{{- define "bkaudit.secretMounts" -}}
{{- $v := .Values -}}
{{- $secrets := include "bkaudit.secretsDir" . -}}
{{- $want := list -}}
{{- with $v.auth.zkAuth.secretName }}{{ $want = append $want (dict "name" "zk-auth" "secret" . "path" (printf "%s/zk-auth" $secrets) "private" true) }}{{ end -}}
{{- with $v.auth.ledgerPassword.secretName }}{{ $want = append $want (dict "name" "ledger-password" "secret" . "path" (printf "%s/ledger-password" $secrets) "private" true) }}{{ end -}}
{{- if $v.auth.pulsarToken.enabled }}{{ $want = append $want (dict "name" "pulsar-token" "secret" (required "auth.pulsarToken.secretName is required with auth.pulsarToken.enabled" (tpl $v.auth.pulsarToken.secretName .)) "path" (printf "%s/pulsar-token" $secrets) "private" true) }}{{ end -}}
{{- with $v.auth.oxiaToken.secretName }}{{ $want = append $want (dict "name" "oxia-token" "secret" . "path" (printf "%s/oxia-token" $secrets) "private" true) }}{{ end -}}
{{- if $v.tls.oxia.enabled -}}
{{- with $v.tls.oxia.secretName }}{{ $want = append $want (dict "name" "oxia-tls" "secret" (tpl . $) "path" $v.tls.oxia.mountPath "private" true) }}{{ end -}}
{{- with $v.tls.oxia.caSecretName }}{{ $want = append $want (dict "name" "oxia-tls-ca" "secret" (tpl . $) "path" $v.tls.oxia.caMountPath "private" false) }}{{ end -}}
{{- end -}}
{{- if $v.tls.zookeeper.enabled -}}
{{- with $v.tls.zookeeper.secretName }}{{ $want = append $want (dict "name" "zk-tls" "secret" (tpl . $) "path" $v.tls.zookeeper.mountPath "private" true) }}{{ end -}}
{{- with $v.tls.zookeeper.caSecretName }}{{ $want = append $want (dict "name" "zk-tls-ca" "secret" (tpl . $) "path" $v.tls.zookeeper.caMountPath "private" false) }}{{ end -}}
{{- end -}}
{{- if $v.tls.bookie.enabled -}}
{{- with $v.tls.bookie.secretName }}{{ $want = append $want (dict "name" "bookie-tls" "secret" (tpl . $) "path" $v.tls.bookie.mountPath "private" true) }}{{ end -}}
{{- $want = append $want (dict "name" "bookie-tls-ca" "secret" (required "tls.bookie.caSecretName is required with bookie TLS" (tpl $v.tls.bookie.caSecretName .)) "path" $v.tls.bookie.caMountPath "private" false) -}}
{{- end -}}
{{- with $v.s3.credentialsSecret.name }}{{ $want = append $want (dict "name" "aws-credentials" "secret" (tpl . $) "path" (printf "%s/aws-credentials" $secrets) "private" true) }}{{ end -}}
{{- if include "bkaudit.adminCa" . }}{{ $want = append $want (dict "name" "pulsar-admin-ca" "secret" (tpl $v.pulsarAdmin.tls.caSecretName .) "path" $v.pulsarAdmin.tls.caMountPath "private" false) }}{{ end -}}
{{- $byPath := dict -}}
{{- $out := list -}}
{{- range $want -}}
{{- $seen := get $byPath .path -}}
{{- if $seen -}}
{{- if ne $seen.secret .secret -}}
{{- fail (printf "%s (Secret %s) and %s (Secret %s) are both mounted at %s: give them the same Secret, or another path" $seen.name $seen.secret .name .secret .path) -}}
{{- end -}}
{{- else -}}
{{- $_ := set $byPath .path . -}}
{{- $out = append $out . -}}
{{- end -}}
{{- end -}}
{{- toYaml (dict "mounts" $out) -}}
{{- end -}}

{{/*
conf/bkaudit.yaml for the release: the `config` values, with the connection, the secret
files and the TLS files filled in by path. Keys are flag names, as in conf/bkaudit.yaml.
*/}}
{{- define "bkaudit.config" -}}
{{- $v := .Values -}}
{{- $secrets := include "bkaudit.secretsDir" . -}}
{{- $global := dict "warehouse" (required "warehouse is required" $v.warehouse) -}}
{{- if $v.metadata.metadataUri -}}
{{- $_ := set $global "metadata-uri" $v.metadata.metadataUri -}}
{{- else -}}
{{- $_ := set $global "zk" (required (printf "metadata.zk or metadata.metadataUri is required (the bookies of Pulsar release %s read %s)" $v.pulsar.release (include "bkaudit.pulsarBookiesUri" .)) $v.metadata.zk) -}}
{{- $_ := set $global "ledgers-root" $v.metadata.ledgersRoot -}}
{{- end -}}
{{- with $v.auth.zkAuth.secretName -}}
{{- $_ := set $global "zk-auth-file" (printf "%s/zk-auth/%s" $secrets $v.auth.zkAuth.key) -}}
{{- end -}}
{{- with $v.auth.ledgerPassword.secretName -}}
{{- $_ := set $global "password-file" (printf "%s/ledger-password/%s" $secrets $v.auth.ledgerPassword.key) -}}
{{- end -}}
{{- with $v.pulsarAdmin.url -}}
{{- $_ := set $global "pulsar-admin-url" . -}}
{{- end -}}
{{- if $v.auth.pulsarToken.enabled -}}
{{- $_ := set $global "pulsar-token-file" (printf "%s/pulsar-token/%s" $secrets $v.auth.pulsarToken.key) -}}
{{- end -}}
{{- if include "bkaudit.adminCa" . -}}
{{- $_ := set $global "pulsar-tls-ca" (printf "%s/ca.crt" $v.pulsarAdmin.tls.caMountPath) -}}
{{- end -}}
{{- if $v.tls.zookeeper.enabled -}}
{{- $_ := set $global "zk-tls" true -}}
{{- with $v.tls.zookeeper.caSecretName -}}
{{- $_ := set $global "zk-tls-ca" (printf "%s/ca.crt" $v.tls.zookeeper.caMountPath) -}}
{{- end -}}
{{- with $v.tls.zookeeper.secretName -}}
{{- $_ := set $global "zk-tls-cert" (printf "%s/tls.crt" $v.tls.zookeeper.mountPath) -}}
{{- $_ := set $global "zk-tls-key" (printf "%s/tls.key" $v.tls.zookeeper.mountPath) -}}
{{- end -}}
{{- end -}}
{{- if $v.tls.oxia.enabled -}}
{{- $_ := set $global "oxia-tls" true -}}
{{- with $v.tls.oxia.caSecretName -}}
{{- $_ := set $global "oxia-tls-ca" (printf "%s/ca.crt" $v.tls.oxia.caMountPath) -}}
{{- end -}}
{{- with $v.tls.oxia.secretName -}}
{{- $_ := set $global "oxia-tls-cert" (printf "%s/tls.crt" $v.tls.oxia.mountPath) -}}
{{- $_ := set $global "oxia-tls-key" (printf "%s/tls.key" $v.tls.oxia.mountPath) -}}
{{- end -}}
{{- with $v.tls.oxia.serverName -}}
{{- $_ := set $global "oxia-tls-server-name" . -}}
{{- end -}}
{{- end -}}
{{- with $v.auth.oxiaToken.secretName -}}
{{- if not $v.tls.oxia.enabled -}}
{{- fail "auth.oxiaToken needs tls.oxia.enabled: a token is sent to Oxia only over TLS" -}}
{{- end -}}
{{- $_ := set $global "oxia-token-file" (printf "%s/oxia-token/%s" $secrets $v.auth.oxiaToken.key) -}}
{{- end -}}
{{- if $v.tls.bookie.enabled -}}
{{- $_ := set $global "tls-provider-factory-class" "org.apache.bookkeeper.tls.TLSContextFactory" -}}
{{- $_ := set $global "tls-trust-store" (printf "%s/ca.crt" $v.tls.bookie.caMountPath) -}}
{{- with $v.tls.bookie.secretName -}}
{{- $_ := set $global "tls-certificate-path" (printf "%s/tls.crt" $v.tls.bookie.mountPath) -}}
{{- $_ := set $global "tls-key-store" (printf "%s/tls.key" $v.tls.bookie.mountPath) -}}
{{- $_ := set $global "tls-client-authentication" true -}}
{{- end -}}
{{- end -}}
{{- $watch := merge (dict "metrics-port" $v.watch.metricsPort "stop-timeout" (printf "%ds" (int $v.watch.stopTimeoutSeconds)) "spool-dir" (include "bkaudit.spoolDir" .)) (index $v.config "watch" | default dict) -}}
{{- $out := merge (dict "global" $global "watch" $watch) (deepCopy $v.config) -}}
{{- toYaml $out -}}
{{- end -}}

{{- define "bkaudit.spoolDir" -}}/var/lib/bkaudit/spool{{- end -}}

{{/* The volumes every bkaudit pod mounts: config, secrets, TLS, scratch space, warehouse. */}}
{{- define "bkaudit.volumes" -}}
- name: config
  configMap:
    name: {{ include "bkaudit.fullname" . }}
- name: tmp
  emptyDir: {}
{{- range (include "bkaudit.secretMounts" . | fromYaml).mounts }}
- name: {{ .name }}
  secret:
    secretName: {{ .secret }}
    {{- if .private }}
    defaultMode: 0400
    {{- end }}
{{- end }}
{{- with .Values.warehouseVolume }}
- name: warehouse
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- end -}}

{{- define "bkaudit.volumeMounts" -}}
- {name: config, mountPath: /etc/bkaudit/config, readOnly: true}
- {name: tmp, mountPath: /tmp}
{{- range (include "bkaudit.secretMounts" . | fromYaml).mounts }}
- {name: {{ .name }}, mountPath: {{ .path }}, readOnly: true}
{{- end }}
{{- if .Values.warehouseVolume }}
- {name: warehouse, mountPath: {{ .Values.warehouseMountPath }}}
{{- end }}
{{- end -}}

{{/*
The watch's pod anti-affinity, in the Pulsar chart's form (e.g. its autorecovery StatefulSet):
no two watch pods of this release in one topology domain (a node by default).
*/}}
{{- define "bkaudit.watchAffinity" -}}
{{- $a := .Values.watch.antiAffinity -}}
{{- $term := dict "labelSelector" (dict "matchExpressions" (list (dict "key" "app" "operator" "In" "values" (list (include "bkaudit.name" .))) (dict "key" "release" "operator" "In" "values" (list .Release.Name)) (dict "key" "component" "operator" "In" "values" (list "watch")))) "topologyKey" $a.topologyKey -}}
podAntiAffinity:
  {{ $a.type }}:
  {{- if eq $a.type "requiredDuringSchedulingIgnoredDuringExecution" }}
    {{- toYaml (list $term) | nindent 4 }}
  {{- else if eq $a.type "preferredDuringSchedulingIgnoredDuringExecution" }}
    {{- toYaml (list (dict "weight" 100 "podAffinityTerm" $term)) | nindent 4 }}
  {{- else }}
  {{- fail (printf "watch.antiAffinity.type %q: requiredDuringSchedulingIgnoredDuringExecution or preferredDuringSchedulingIgnoredDuringExecution" $a.type) }}
  {{- end }}
{{- end -}}

{{/* Where the Spark driver reads the executors' pod template. */}}
{{- define "bkaudit.sparkExecutorTemplate" -}}/etc/bkaudit/spark/executor.yaml{{- end -}}

{{- define "bkaudit.configFlag" -}}--config=/etc/bkaudit/config/bkaudit.yaml{{- end -}}


{{/* True (non-empty) when the warehouse is on S3 (s3:// or s3a://). */}}
{{- define "bkaudit.s3Warehouse" -}}
{{- if or (hasPrefix "s3://" .Values.warehouse) (hasPrefix "s3a://" .Values.warehouse) -}}true{{- end -}}
{{- end -}}

{{/*
The standard AWS environment of an S3 warehouse, for every bkaudit container: the store's
endpoint and region, and the mounted shared credentials file. Never a key: credentials come
from that file or from the ServiceAccount's workload identity (docs/kubernetes.md).
*/}}
{{- define "bkaudit.s3Env" -}}
{{- $s3 := .Values.s3 -}}
{{- with $s3.endpoint }}
- {name: AWS_ENDPOINT_URL, value: {{ . | quote }}}
{{- end }}
{{- with $s3.region }}
- {name: AWS_REGION, value: {{ . | quote }}}
{{- end }}
{{- with $s3.credentialsSecret.name }}
- {name: AWS_SHARED_CREDENTIALS_FILE, value: {{ printf "%s/aws-credentials/%s" (include "bkaudit.secretsDir" $) $s3.credentialsSecret.key | quote }}}
{{- end }}
{{- end -}}

{{/*
The Spark audit's s3a settings, from the same values as bkaudit.s3Env (what
jobs/spark/s3.py's s3a_conf gives a session it builds itself): the endpoint with path-style
addressing, the region, the AWS SDK's own credential chain, and bkaudit's Delta log store,
whose conditional PUT keeps a Spark commit from replacing another writer's.
*/}}
{{- define "bkaudit.sparkS3Conf" -}}
{{- $s3 := .Values.s3 -}}
- --conf=spark.delta.logStore.s3a.impl=io.bkaudit.delta.ConditionalPutLogStore
- --conf=spark.delta.logStore.s3.impl=io.bkaudit.delta.ConditionalPutLogStore
- --conf=spark.hadoop.fs.s3a.aws.credentials.provider=software.amazon.awssdk.auth.credentials.DefaultCredentialsProvider
- --conf=spark.kubernetes.authenticate.executor.serviceAccountName={{ include "bkaudit.sparkServiceAccount" . }}
{{- with $s3.endpoint }}
- --conf=spark.hadoop.fs.s3a.endpoint={{ . }}
- --conf=spark.hadoop.fs.s3a.path.style.access=true
- --conf=spark.hadoop.fs.s3a.connection.ssl.enabled={{ hasPrefix "https://" . }}
{{- end }}
{{- with $s3.region }}
- --conf=spark.hadoop.fs.s3a.endpoint.region={{ . }}
{{- end }}
{{- end -}}

{{/* The ServiceAccount of the watch and the scheduled audit ("" : the namespace's default). */}}
{{- define "bkaudit.serviceAccount" -}}
{{- if .Values.serviceAccount.create -}}
{{- .Values.serviceAccount.name | default (include "bkaudit.fullname" .) -}}
{{- else -}}
{{- .Values.serviceAccount.name -}}
{{- end -}}
{{- end -}}
