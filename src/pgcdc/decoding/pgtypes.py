"""PostgreSQL's built-in types: OIDs, names and array relations.

Generated from pg_type of PostgreSQL 18 (built-in OIDs are stable across versions). Decoders use it
to name types by OID (pgoutput sends OIDs) and to find OIDs by name (test_decoding sends the
``format_type`` spelling, e.g. ``timestamp with time zone``).
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class BuiltinType:
    oid: int
    name: str
    # format_type(oid, NULL): how test_decoding and psql spell it ("character varying").
    sql_name: str
    # pg_type.typcategory: 'A' array, 'N' numeric, 'S' string, 'D' date/time, ...
    category: str
    array_oid: int = 0
    element_oid: int = 0


BUILTIN_TYPES: tuple[BuiltinType, ...] = (
    BuiltinType(16, "bool", "boolean", "B", array_oid=1000, element_oid=0),
    BuiltinType(17, "bytea", "bytea", "U", array_oid=1001, element_oid=0),
    BuiltinType(18, "char", '"char"', "Z", array_oid=1002, element_oid=0),
    BuiltinType(19, "name", "name", "S", array_oid=1003, element_oid=18),
    BuiltinType(20, "int8", "bigint", "N", array_oid=1016, element_oid=0),
    BuiltinType(21, "int2", "smallint", "N", array_oid=1005, element_oid=0),
    BuiltinType(22, "int2vector", "int2vector", "A", array_oid=1006, element_oid=21),
    BuiltinType(23, "int4", "integer", "N", array_oid=1007, element_oid=0),
    BuiltinType(24, "regproc", "regproc", "N", array_oid=1008, element_oid=0),
    BuiltinType(25, "text", "text", "S", array_oid=1009, element_oid=0),
    BuiltinType(26, "oid", "oid", "N", array_oid=1028, element_oid=0),
    BuiltinType(27, "tid", "tid", "U", array_oid=1010, element_oid=0),
    BuiltinType(28, "xid", "xid", "U", array_oid=1011, element_oid=0),
    BuiltinType(29, "cid", "cid", "U", array_oid=1012, element_oid=0),
    BuiltinType(30, "oidvector", "oidvector", "A", array_oid=1013, element_oid=26),
    BuiltinType(114, "json", "json", "U", array_oid=199, element_oid=0),
    BuiltinType(142, "xml", "xml", "U", array_oid=143, element_oid=0),
    BuiltinType(143, "_xml", "xml[]", "A", array_oid=0, element_oid=142),
    BuiltinType(199, "_json", "json[]", "A", array_oid=0, element_oid=114),
    BuiltinType(210, "_pg_type", "pg_type[]", "A", array_oid=0, element_oid=71),
    BuiltinType(270, "_pg_attribute", "pg_attribute[]", "A", array_oid=0, element_oid=75),
    BuiltinType(271, "_xid8", "xid8[]", "A", array_oid=0, element_oid=5069),
    BuiltinType(272, "_pg_proc", "pg_proc[]", "A", array_oid=0, element_oid=81),
    BuiltinType(273, "_pg_class", "pg_class[]", "A", array_oid=0, element_oid=83),
    BuiltinType(600, "point", "point", "G", array_oid=1017, element_oid=701),
    BuiltinType(601, "lseg", "lseg", "G", array_oid=1018, element_oid=600),
    BuiltinType(602, "path", "path", "G", array_oid=1019, element_oid=0),
    BuiltinType(603, "box", "box", "G", array_oid=1020, element_oid=600),
    BuiltinType(604, "polygon", "polygon", "G", array_oid=1027, element_oid=0),
    BuiltinType(628, "line", "line", "G", array_oid=629, element_oid=701),
    BuiltinType(629, "_line", "line[]", "A", array_oid=0, element_oid=628),
    BuiltinType(650, "cidr", "cidr", "I", array_oid=651, element_oid=0),
    BuiltinType(651, "_cidr", "cidr[]", "A", array_oid=0, element_oid=650),
    BuiltinType(700, "float4", "real", "N", array_oid=1021, element_oid=0),
    BuiltinType(701, "float8", "double precision", "N", array_oid=1022, element_oid=0),
    BuiltinType(718, "circle", "circle", "G", array_oid=719, element_oid=0),
    BuiltinType(719, "_circle", "circle[]", "A", array_oid=0, element_oid=718),
    BuiltinType(774, "macaddr8", "macaddr8", "U", array_oid=775, element_oid=0),
    BuiltinType(775, "_macaddr8", "macaddr8[]", "A", array_oid=0, element_oid=774),
    BuiltinType(790, "money", "money", "N", array_oid=791, element_oid=0),
    BuiltinType(791, "_money", "money[]", "A", array_oid=0, element_oid=790),
    BuiltinType(829, "macaddr", "macaddr", "U", array_oid=1040, element_oid=0),
    BuiltinType(869, "inet", "inet", "I", array_oid=1041, element_oid=0),
    BuiltinType(1000, "_bool", "boolean[]", "A", array_oid=0, element_oid=16),
    BuiltinType(1001, "_bytea", "bytea[]", "A", array_oid=0, element_oid=17),
    BuiltinType(1002, "_char", '"char"[]', "A", array_oid=0, element_oid=18),
    BuiltinType(1003, "_name", "name[]", "A", array_oid=0, element_oid=19),
    BuiltinType(1005, "_int2", "smallint[]", "A", array_oid=0, element_oid=21),
    BuiltinType(1006, "_int2vector", "int2vector[]", "A", array_oid=0, element_oid=22),
    BuiltinType(1007, "_int4", "integer[]", "A", array_oid=0, element_oid=23),
    BuiltinType(1008, "_regproc", "regproc[]", "A", array_oid=0, element_oid=24),
    BuiltinType(1009, "_text", "text[]", "A", array_oid=0, element_oid=25),
    BuiltinType(1010, "_tid", "tid[]", "A", array_oid=0, element_oid=27),
    BuiltinType(1011, "_xid", "xid[]", "A", array_oid=0, element_oid=28),
    BuiltinType(1012, "_cid", "cid[]", "A", array_oid=0, element_oid=29),
    BuiltinType(1013, "_oidvector", "oidvector[]", "A", array_oid=0, element_oid=30),
    BuiltinType(1014, "_bpchar", "character[]", "A", array_oid=0, element_oid=1042),
    BuiltinType(1015, "_varchar", "character varying[]", "A", array_oid=0, element_oid=1043),
    BuiltinType(1016, "_int8", "bigint[]", "A", array_oid=0, element_oid=20),
    BuiltinType(1017, "_point", "point[]", "A", array_oid=0, element_oid=600),
    BuiltinType(1018, "_lseg", "lseg[]", "A", array_oid=0, element_oid=601),
    BuiltinType(1019, "_path", "path[]", "A", array_oid=0, element_oid=602),
    BuiltinType(1020, "_box", "box[]", "A", array_oid=0, element_oid=603),
    BuiltinType(1021, "_float4", "real[]", "A", array_oid=0, element_oid=700),
    BuiltinType(1022, "_float8", "double precision[]", "A", array_oid=0, element_oid=701),
    BuiltinType(1027, "_polygon", "polygon[]", "A", array_oid=0, element_oid=604),
    BuiltinType(1028, "_oid", "oid[]", "A", array_oid=0, element_oid=26),
    BuiltinType(1033, "aclitem", "aclitem", "U", array_oid=1034, element_oid=0),
    BuiltinType(1034, "_aclitem", "aclitem[]", "A", array_oid=0, element_oid=1033),
    BuiltinType(1040, "_macaddr", "macaddr[]", "A", array_oid=0, element_oid=829),
    BuiltinType(1041, "_inet", "inet[]", "A", array_oid=0, element_oid=869),
    BuiltinType(1042, "bpchar", "character", "S", array_oid=1014, element_oid=0),
    BuiltinType(1043, "varchar", "character varying", "S", array_oid=1015, element_oid=0),
    BuiltinType(1082, "date", "date", "D", array_oid=1182, element_oid=0),
    BuiltinType(1083, "time", "time without time zone", "D", array_oid=1183, element_oid=0),
    BuiltinType(
        1114, "timestamp", "timestamp without time zone", "D", array_oid=1115, element_oid=0
    ),
    BuiltinType(
        1115, "_timestamp", "timestamp without time zone[]", "A", array_oid=0, element_oid=1114
    ),
    BuiltinType(1182, "_date", "date[]", "A", array_oid=0, element_oid=1082),
    BuiltinType(1183, "_time", "time without time zone[]", "A", array_oid=0, element_oid=1083),
    BuiltinType(
        1184, "timestamptz", "timestamp with time zone", "D", array_oid=1185, element_oid=0
    ),
    BuiltinType(
        1185, "_timestamptz", "timestamp with time zone[]", "A", array_oid=0, element_oid=1184
    ),
    BuiltinType(1186, "interval", "interval", "T", array_oid=1187, element_oid=0),
    BuiltinType(1187, "_interval", "interval[]", "A", array_oid=0, element_oid=1186),
    BuiltinType(1231, "_numeric", "numeric[]", "A", array_oid=0, element_oid=1700),
    BuiltinType(1263, "_cstring", "cstring[]", "A", array_oid=0, element_oid=2275),
    BuiltinType(1266, "timetz", "time with time zone", "D", array_oid=1270, element_oid=0),
    BuiltinType(1270, "_timetz", "time with time zone[]", "A", array_oid=0, element_oid=1266),
    BuiltinType(1560, "bit", "bit", "V", array_oid=1561, element_oid=0),
    BuiltinType(1561, "_bit", "bit[]", "A", array_oid=0, element_oid=1560),
    BuiltinType(1562, "varbit", "bit varying", "V", array_oid=1563, element_oid=0),
    BuiltinType(1563, "_varbit", "bit varying[]", "A", array_oid=0, element_oid=1562),
    BuiltinType(1700, "numeric", "numeric", "N", array_oid=1231, element_oid=0),
    BuiltinType(1790, "refcursor", "refcursor", "U", array_oid=2201, element_oid=0),
    BuiltinType(2201, "_refcursor", "refcursor[]", "A", array_oid=0, element_oid=1790),
    BuiltinType(2202, "regprocedure", "regprocedure", "N", array_oid=2207, element_oid=0),
    BuiltinType(2203, "regoper", "regoper", "N", array_oid=2208, element_oid=0),
    BuiltinType(2204, "regoperator", "regoperator", "N", array_oid=2209, element_oid=0),
    BuiltinType(2205, "regclass", "regclass", "N", array_oid=2210, element_oid=0),
    BuiltinType(2206, "regtype", "regtype", "N", array_oid=2211, element_oid=0),
    BuiltinType(2207, "_regprocedure", "regprocedure[]", "A", array_oid=0, element_oid=2202),
    BuiltinType(2208, "_regoper", "regoper[]", "A", array_oid=0, element_oid=2203),
    BuiltinType(2209, "_regoperator", "regoperator[]", "A", array_oid=0, element_oid=2204),
    BuiltinType(2210, "_regclass", "regclass[]", "A", array_oid=0, element_oid=2205),
    BuiltinType(2211, "_regtype", "regtype[]", "A", array_oid=0, element_oid=2206),
    BuiltinType(2949, "_txid_snapshot", "txid_snapshot[]", "A", array_oid=0, element_oid=2970),
    BuiltinType(2950, "uuid", "uuid", "U", array_oid=2951, element_oid=0),
    BuiltinType(2951, "_uuid", "uuid[]", "A", array_oid=0, element_oid=2950),
    BuiltinType(2970, "txid_snapshot", "txid_snapshot", "U", array_oid=2949, element_oid=0),
    BuiltinType(3220, "pg_lsn", "pg_lsn", "U", array_oid=3221, element_oid=0),
    BuiltinType(3221, "_pg_lsn", "pg_lsn[]", "A", array_oid=0, element_oid=3220),
    BuiltinType(3614, "tsvector", "tsvector", "U", array_oid=3643, element_oid=0),
    BuiltinType(3615, "tsquery", "tsquery", "U", array_oid=3645, element_oid=0),
    BuiltinType(3642, "gtsvector", "gtsvector", "U", array_oid=3644, element_oid=0),
    BuiltinType(3643, "_tsvector", "tsvector[]", "A", array_oid=0, element_oid=3614),
    BuiltinType(3644, "_gtsvector", "gtsvector[]", "A", array_oid=0, element_oid=3642),
    BuiltinType(3645, "_tsquery", "tsquery[]", "A", array_oid=0, element_oid=3615),
    BuiltinType(3734, "regconfig", "regconfig", "N", array_oid=3735, element_oid=0),
    BuiltinType(3735, "_regconfig", "regconfig[]", "A", array_oid=0, element_oid=3734),
    BuiltinType(3769, "regdictionary", "regdictionary", "N", array_oid=3770, element_oid=0),
    BuiltinType(3770, "_regdictionary", "regdictionary[]", "A", array_oid=0, element_oid=3769),
    BuiltinType(3802, "jsonb", "jsonb", "U", array_oid=3807, element_oid=0),
    BuiltinType(3807, "_jsonb", "jsonb[]", "A", array_oid=0, element_oid=3802),
    BuiltinType(3904, "int4range", "int4range", "R", array_oid=3905, element_oid=0),
    BuiltinType(3905, "_int4range", "int4range[]", "A", array_oid=0, element_oid=3904),
    BuiltinType(3906, "numrange", "numrange", "R", array_oid=3907, element_oid=0),
    BuiltinType(3907, "_numrange", "numrange[]", "A", array_oid=0, element_oid=3906),
    BuiltinType(3908, "tsrange", "tsrange", "R", array_oid=3909, element_oid=0),
    BuiltinType(3909, "_tsrange", "tsrange[]", "A", array_oid=0, element_oid=3908),
    BuiltinType(3910, "tstzrange", "tstzrange", "R", array_oid=3911, element_oid=0),
    BuiltinType(3911, "_tstzrange", "tstzrange[]", "A", array_oid=0, element_oid=3910),
    BuiltinType(3912, "daterange", "daterange", "R", array_oid=3913, element_oid=0),
    BuiltinType(3913, "_daterange", "daterange[]", "A", array_oid=0, element_oid=3912),
    BuiltinType(3926, "int8range", "int8range", "R", array_oid=3927, element_oid=0),
    BuiltinType(3927, "_int8range", "int8range[]", "A", array_oid=0, element_oid=3926),
    BuiltinType(4072, "jsonpath", "jsonpath", "U", array_oid=4073, element_oid=0),
    BuiltinType(4073, "_jsonpath", "jsonpath[]", "A", array_oid=0, element_oid=4072),
    BuiltinType(4089, "regnamespace", "regnamespace", "N", array_oid=4090, element_oid=0),
    BuiltinType(4090, "_regnamespace", "regnamespace[]", "A", array_oid=0, element_oid=4089),
    BuiltinType(4096, "regrole", "regrole", "N", array_oid=4097, element_oid=0),
    BuiltinType(4097, "_regrole", "regrole[]", "A", array_oid=0, element_oid=4096),
    BuiltinType(4191, "regcollation", "regcollation", "N", array_oid=4192, element_oid=0),
    BuiltinType(4192, "_regcollation", "regcollation[]", "A", array_oid=0, element_oid=4191),
    BuiltinType(4451, "int4multirange", "int4multirange", "R", array_oid=6150, element_oid=0),
    BuiltinType(4532, "nummultirange", "nummultirange", "R", array_oid=6151, element_oid=0),
    BuiltinType(4533, "tsmultirange", "tsmultirange", "R", array_oid=6152, element_oid=0),
    BuiltinType(4534, "tstzmultirange", "tstzmultirange", "R", array_oid=6153, element_oid=0),
    BuiltinType(4535, "datemultirange", "datemultirange", "R", array_oid=6155, element_oid=0),
    BuiltinType(4536, "int8multirange", "int8multirange", "R", array_oid=6157, element_oid=0),
    BuiltinType(5038, "pg_snapshot", "pg_snapshot", "U", array_oid=5039, element_oid=0),
    BuiltinType(5039, "_pg_snapshot", "pg_snapshot[]", "A", array_oid=0, element_oid=5038),
    BuiltinType(5069, "xid8", "xid8", "U", array_oid=271, element_oid=0),
    BuiltinType(6150, "_int4multirange", "int4multirange[]", "A", array_oid=0, element_oid=4451),
    BuiltinType(6151, "_nummultirange", "nummultirange[]", "A", array_oid=0, element_oid=4532),
    BuiltinType(6152, "_tsmultirange", "tsmultirange[]", "A", array_oid=0, element_oid=4533),
    BuiltinType(6153, "_tstzmultirange", "tstzmultirange[]", "A", array_oid=0, element_oid=4534),
    BuiltinType(6155, "_datemultirange", "datemultirange[]", "A", array_oid=0, element_oid=4535),
    BuiltinType(6157, "_int8multirange", "int8multirange[]", "A", array_oid=0, element_oid=4536),
    BuiltinType(10000, "_pg_attrdef", "pg_attrdef[]", "A", array_oid=0, element_oid=10001),
    BuiltinType(10002, "_pg_constraint", "pg_constraint[]", "A", array_oid=0, element_oid=10003),
    BuiltinType(10004, "_pg_inherits", "pg_inherits[]", "A", array_oid=0, element_oid=10005),
    BuiltinType(10006, "_pg_index", "pg_index[]", "A", array_oid=0, element_oid=10007),
    BuiltinType(10008, "_pg_operator", "pg_operator[]", "A", array_oid=0, element_oid=10009),
    BuiltinType(10010, "_pg_opfamily", "pg_opfamily[]", "A", array_oid=0, element_oid=10011),
    BuiltinType(10012, "_pg_opclass", "pg_opclass[]", "A", array_oid=0, element_oid=10013),
    BuiltinType(10014, "_pg_am", "pg_am[]", "A", array_oid=0, element_oid=10015),
    BuiltinType(10016, "_pg_amop", "pg_amop[]", "A", array_oid=0, element_oid=10017),
    BuiltinType(10018, "_pg_amproc", "pg_amproc[]", "A", array_oid=0, element_oid=10019),
    BuiltinType(10020, "_pg_language", "pg_language[]", "A", array_oid=0, element_oid=10021),
    BuiltinType(
        10022,
        "_pg_largeobject_metadata",
        "pg_largeobject_metadata[]",
        "A",
        array_oid=0,
        element_oid=10023,
    ),
    BuiltinType(10024, "_pg_largeobject", "pg_largeobject[]", "A", array_oid=0, element_oid=10025),
    BuiltinType(10026, "_pg_aggregate", "pg_aggregate[]", "A", array_oid=0, element_oid=10027),
    BuiltinType(10028, "_pg_statistic", "pg_statistic[]", "A", array_oid=0, element_oid=10029),
    BuiltinType(
        10030, "_pg_statistic_ext", "pg_statistic_ext[]", "A", array_oid=0, element_oid=10031
    ),
    BuiltinType(
        10032,
        "_pg_statistic_ext_data",
        "pg_statistic_ext_data[]",
        "A",
        array_oid=0,
        element_oid=10033,
    ),
    BuiltinType(10034, "_pg_rewrite", "pg_rewrite[]", "A", array_oid=0, element_oid=10035),
    BuiltinType(10036, "_pg_trigger", "pg_trigger[]", "A", array_oid=0, element_oid=10037),
    BuiltinType(
        10038, "_pg_event_trigger", "pg_event_trigger[]", "A", array_oid=0, element_oid=10039
    ),
    BuiltinType(10040, "_pg_description", "pg_description[]", "A", array_oid=0, element_oid=10041),
    BuiltinType(10042, "_pg_cast", "pg_cast[]", "A", array_oid=0, element_oid=10043),
    BuiltinType(10044, "_pg_enum", "pg_enum[]", "A", array_oid=0, element_oid=10045),
    BuiltinType(10046, "_pg_namespace", "pg_namespace[]", "A", array_oid=0, element_oid=10047),
    BuiltinType(10048, "_pg_conversion", "pg_conversion[]", "A", array_oid=0, element_oid=10049),
    BuiltinType(10050, "_pg_depend", "pg_depend[]", "A", array_oid=0, element_oid=10051),
    BuiltinType(10052, "_pg_database", "pg_database[]", "A", array_oid=0, element_oid=1248),
    BuiltinType(
        10053, "_pg_db_role_setting", "pg_db_role_setting[]", "A", array_oid=0, element_oid=10054
    ),
    BuiltinType(10055, "_pg_tablespace", "pg_tablespace[]", "A", array_oid=0, element_oid=10056),
    BuiltinType(10057, "_pg_authid", "pg_authid[]", "A", array_oid=0, element_oid=2842),
    BuiltinType(10058, "_pg_auth_members", "pg_auth_members[]", "A", array_oid=0, element_oid=2843),
    BuiltinType(10059, "_pg_shdepend", "pg_shdepend[]", "A", array_oid=0, element_oid=10060),
    BuiltinType(
        10061, "_pg_shdescription", "pg_shdescription[]", "A", array_oid=0, element_oid=10062
    ),
    BuiltinType(10063, "_pg_ts_config", "pg_ts_config[]", "A", array_oid=0, element_oid=10064),
    BuiltinType(
        10065, "_pg_ts_config_map", "pg_ts_config_map[]", "A", array_oid=0, element_oid=10066
    ),
    BuiltinType(10067, "_pg_ts_dict", "pg_ts_dict[]", "A", array_oid=0, element_oid=10068),
    BuiltinType(10069, "_pg_ts_parser", "pg_ts_parser[]", "A", array_oid=0, element_oid=10070),
    BuiltinType(10071, "_pg_ts_template", "pg_ts_template[]", "A", array_oid=0, element_oid=10072),
    BuiltinType(10073, "_pg_extension", "pg_extension[]", "A", array_oid=0, element_oid=10074),
    BuiltinType(
        10075,
        "_pg_foreign_data_wrapper",
        "pg_foreign_data_wrapper[]",
        "A",
        array_oid=0,
        element_oid=10076,
    ),
    BuiltinType(
        10077, "_pg_foreign_server", "pg_foreign_server[]", "A", array_oid=0, element_oid=10078
    ),
    BuiltinType(
        10079, "_pg_user_mapping", "pg_user_mapping[]", "A", array_oid=0, element_oid=10080
    ),
    BuiltinType(
        10081, "_pg_foreign_table", "pg_foreign_table[]", "A", array_oid=0, element_oid=10082
    ),
    BuiltinType(10083, "_pg_policy", "pg_policy[]", "A", array_oid=0, element_oid=10084),
    BuiltinType(
        10085,
        "_pg_replication_origin",
        "pg_replication_origin[]",
        "A",
        array_oid=0,
        element_oid=10086,
    ),
    BuiltinType(10087, "_pg_default_acl", "pg_default_acl[]", "A", array_oid=0, element_oid=10088),
    BuiltinType(10089, "_pg_init_privs", "pg_init_privs[]", "A", array_oid=0, element_oid=10090),
    BuiltinType(10091, "_pg_seclabel", "pg_seclabel[]", "A", array_oid=0, element_oid=10092),
    BuiltinType(10093, "_pg_shseclabel", "pg_shseclabel[]", "A", array_oid=0, element_oid=4066),
    BuiltinType(10094, "_pg_collation", "pg_collation[]", "A", array_oid=0, element_oid=10095),
    BuiltinType(
        10096, "_pg_parameter_acl", "pg_parameter_acl[]", "A", array_oid=0, element_oid=10097
    ),
    BuiltinType(
        10098,
        "_pg_partitioned_table",
        "pg_partitioned_table[]",
        "A",
        array_oid=0,
        element_oid=10099,
    ),
    BuiltinType(10100, "_pg_range", "pg_range[]", "A", array_oid=0, element_oid=10101),
    BuiltinType(10102, "_pg_transform", "pg_transform[]", "A", array_oid=0, element_oid=10103),
    BuiltinType(10104, "_pg_sequence", "pg_sequence[]", "A", array_oid=0, element_oid=10105),
    BuiltinType(10106, "_pg_publication", "pg_publication[]", "A", array_oid=0, element_oid=10107),
    BuiltinType(
        10108,
        "_pg_publication_namespace",
        "pg_publication_namespace[]",
        "A",
        array_oid=0,
        element_oid=10109,
    ),
    BuiltinType(
        10110, "_pg_publication_rel", "pg_publication_rel[]", "A", array_oid=0, element_oid=10111
    ),
    BuiltinType(10112, "_pg_subscription", "pg_subscription[]", "A", array_oid=0, element_oid=6101),
    BuiltinType(
        10113, "_pg_subscription_rel", "pg_subscription_rel[]", "A", array_oid=0, element_oid=10114
    ),
    BuiltinType(12001, "_pg_roles", "pg_roles[]", "A", array_oid=0, element_oid=12002),
    BuiltinType(12006, "_pg_shadow", "pg_shadow[]", "A", array_oid=0, element_oid=12007),
    BuiltinType(12011, "_pg_group", "pg_group[]", "A", array_oid=0, element_oid=12012),
    BuiltinType(12015, "_pg_user", "pg_user[]", "A", array_oid=0, element_oid=12016),
    BuiltinType(12019, "_pg_policies", "pg_policies[]", "A", array_oid=0, element_oid=12020),
    BuiltinType(12024, "_pg_rules", "pg_rules[]", "A", array_oid=0, element_oid=12025),
    BuiltinType(12029, "_pg_views", "pg_views[]", "A", array_oid=0, element_oid=12030),
    BuiltinType(12034, "_pg_tables", "pg_tables[]", "A", array_oid=0, element_oid=12035),
    BuiltinType(12039, "_pg_matviews", "pg_matviews[]", "A", array_oid=0, element_oid=12040),
    BuiltinType(12044, "_pg_indexes", "pg_indexes[]", "A", array_oid=0, element_oid=12045),
    BuiltinType(12049, "_pg_sequences", "pg_sequences[]", "A", array_oid=0, element_oid=12050),
    BuiltinType(12054, "_pg_stats", "pg_stats[]", "A", array_oid=0, element_oid=12055),
    BuiltinType(12059, "_pg_stats_ext", "pg_stats_ext[]", "A", array_oid=0, element_oid=12060),
    BuiltinType(
        12064, "_pg_stats_ext_exprs", "pg_stats_ext_exprs[]", "A", array_oid=0, element_oid=12065
    ),
    BuiltinType(
        12069,
        "_pg_publication_tables",
        "pg_publication_tables[]",
        "A",
        array_oid=0,
        element_oid=12070,
    ),
    BuiltinType(12074, "_pg_locks", "pg_locks[]", "A", array_oid=0, element_oid=12075),
    BuiltinType(12078, "_pg_cursors", "pg_cursors[]", "A", array_oid=0, element_oid=12079),
    BuiltinType(
        12082,
        "_pg_available_extensions",
        "pg_available_extensions[]",
        "A",
        array_oid=0,
        element_oid=12083,
    ),
    BuiltinType(
        12086,
        "_pg_available_extension_versions",
        "pg_available_extension_versions[]",
        "A",
        array_oid=0,
        element_oid=12087,
    ),
    BuiltinType(
        12091, "_pg_prepared_xacts", "pg_prepared_xacts[]", "A", array_oid=0, element_oid=12092
    ),
    BuiltinType(
        12096,
        "_pg_prepared_statements",
        "pg_prepared_statements[]",
        "A",
        array_oid=0,
        element_oid=12097,
    ),
    BuiltinType(12100, "_pg_seclabels", "pg_seclabels[]", "A", array_oid=0, element_oid=12101),
    BuiltinType(12105, "_pg_settings", "pg_settings[]", "A", array_oid=0, element_oid=12106),
    BuiltinType(
        12111, "_pg_file_settings", "pg_file_settings[]", "A", array_oid=0, element_oid=12112
    ),
    BuiltinType(
        12115, "_pg_hba_file_rules", "pg_hba_file_rules[]", "A", array_oid=0, element_oid=12116
    ),
    BuiltinType(
        12119,
        "_pg_ident_file_mappings",
        "pg_ident_file_mappings[]",
        "A",
        array_oid=0,
        element_oid=12120,
    ),
    BuiltinType(
        12123, "_pg_timezone_abbrevs", "pg_timezone_abbrevs[]", "A", array_oid=0, element_oid=12124
    ),
    BuiltinType(
        12127, "_pg_timezone_names", "pg_timezone_names[]", "A", array_oid=0, element_oid=12128
    ),
    BuiltinType(12131, "_pg_config", "pg_config[]", "A", array_oid=0, element_oid=12132),
    BuiltinType(
        12135,
        "_pg_shmem_allocations",
        "pg_shmem_allocations[]",
        "A",
        array_oid=0,
        element_oid=12136,
    ),
    BuiltinType(
        12139,
        "_pg_shmem_allocations_numa",
        "pg_shmem_allocations_numa[]",
        "A",
        array_oid=0,
        element_oid=12140,
    ),
    BuiltinType(
        12143,
        "_pg_backend_memory_contexts",
        "pg_backend_memory_contexts[]",
        "A",
        array_oid=0,
        element_oid=12144,
    ),
    BuiltinType(
        12147, "_pg_stat_all_tables", "pg_stat_all_tables[]", "A", array_oid=0, element_oid=12148
    ),
    BuiltinType(
        12152,
        "_pg_stat_xact_all_tables",
        "pg_stat_xact_all_tables[]",
        "A",
        array_oid=0,
        element_oid=12153,
    ),
    BuiltinType(
        12157, "_pg_stat_sys_tables", "pg_stat_sys_tables[]", "A", array_oid=0, element_oid=12158
    ),
    BuiltinType(
        12162,
        "_pg_stat_xact_sys_tables",
        "pg_stat_xact_sys_tables[]",
        "A",
        array_oid=0,
        element_oid=12163,
    ),
    BuiltinType(
        12166, "_pg_stat_user_tables", "pg_stat_user_tables[]", "A", array_oid=0, element_oid=12167
    ),
    BuiltinType(
        12171,
        "_pg_stat_xact_user_tables",
        "pg_stat_xact_user_tables[]",
        "A",
        array_oid=0,
        element_oid=12172,
    ),
    BuiltinType(
        12175,
        "_pg_statio_all_tables",
        "pg_statio_all_tables[]",
        "A",
        array_oid=0,
        element_oid=12176,
    ),
    BuiltinType(
        12180,
        "_pg_statio_sys_tables",
        "pg_statio_sys_tables[]",
        "A",
        array_oid=0,
        element_oid=12181,
    ),
    BuiltinType(
        12184,
        "_pg_statio_user_tables",
        "pg_statio_user_tables[]",
        "A",
        array_oid=0,
        element_oid=12185,
    ),
    BuiltinType(
        12188, "_pg_stat_all_indexes", "pg_stat_all_indexes[]", "A", array_oid=0, element_oid=12189
    ),
    BuiltinType(
        12193, "_pg_stat_sys_indexes", "pg_stat_sys_indexes[]", "A", array_oid=0, element_oid=12194
    ),
    BuiltinType(
        12197,
        "_pg_stat_user_indexes",
        "pg_stat_user_indexes[]",
        "A",
        array_oid=0,
        element_oid=12198,
    ),
    BuiltinType(
        12201,
        "_pg_statio_all_indexes",
        "pg_statio_all_indexes[]",
        "A",
        array_oid=0,
        element_oid=12202,
    ),
    BuiltinType(
        12206,
        "_pg_statio_sys_indexes",
        "pg_statio_sys_indexes[]",
        "A",
        array_oid=0,
        element_oid=12207,
    ),
    BuiltinType(
        12210,
        "_pg_statio_user_indexes",
        "pg_statio_user_indexes[]",
        "A",
        array_oid=0,
        element_oid=12211,
    ),
    BuiltinType(
        12214,
        "_pg_statio_all_sequences",
        "pg_statio_all_sequences[]",
        "A",
        array_oid=0,
        element_oid=12215,
    ),
    BuiltinType(
        12219,
        "_pg_statio_sys_sequences",
        "pg_statio_sys_sequences[]",
        "A",
        array_oid=0,
        element_oid=12220,
    ),
    BuiltinType(
        12223,
        "_pg_statio_user_sequences",
        "pg_statio_user_sequences[]",
        "A",
        array_oid=0,
        element_oid=12224,
    ),
    BuiltinType(
        12227, "_pg_stat_activity", "pg_stat_activity[]", "A", array_oid=0, element_oid=12228
    ),
    BuiltinType(
        12232, "_pg_stat_replication", "pg_stat_replication[]", "A", array_oid=0, element_oid=12233
    ),
    BuiltinType(12237, "_pg_stat_slru", "pg_stat_slru[]", "A", array_oid=0, element_oid=12238),
    BuiltinType(
        12241,
        "_pg_stat_wal_receiver",
        "pg_stat_wal_receiver[]",
        "A",
        array_oid=0,
        element_oid=12242,
    ),
    BuiltinType(
        12245,
        "_pg_stat_recovery_prefetch",
        "pg_stat_recovery_prefetch[]",
        "A",
        array_oid=0,
        element_oid=12246,
    ),
    BuiltinType(
        12249,
        "_pg_stat_subscription",
        "pg_stat_subscription[]",
        "A",
        array_oid=0,
        element_oid=12250,
    ),
    BuiltinType(12254, "_pg_stat_ssl", "pg_stat_ssl[]", "A", array_oid=0, element_oid=12255),
    BuiltinType(12258, "_pg_stat_gssapi", "pg_stat_gssapi[]", "A", array_oid=0, element_oid=12259),
    BuiltinType(
        12262,
        "_pg_replication_slots",
        "pg_replication_slots[]",
        "A",
        array_oid=0,
        element_oid=12263,
    ),
    BuiltinType(
        12267,
        "_pg_stat_replication_slots",
        "pg_stat_replication_slots[]",
        "A",
        array_oid=0,
        element_oid=12268,
    ),
    BuiltinType(
        12271, "_pg_stat_database", "pg_stat_database[]", "A", array_oid=0, element_oid=12272
    ),
    BuiltinType(
        12276,
        "_pg_stat_database_conflicts",
        "pg_stat_database_conflicts[]",
        "A",
        array_oid=0,
        element_oid=12277,
    ),
    BuiltinType(
        12280,
        "_pg_stat_user_functions",
        "pg_stat_user_functions[]",
        "A",
        array_oid=0,
        element_oid=12281,
    ),
    BuiltinType(
        12285,
        "_pg_stat_xact_user_functions",
        "pg_stat_xact_user_functions[]",
        "A",
        array_oid=0,
        element_oid=12286,
    ),
    BuiltinType(
        12290, "_pg_stat_archiver", "pg_stat_archiver[]", "A", array_oid=0, element_oid=12291
    ),
    BuiltinType(
        12294, "_pg_stat_bgwriter", "pg_stat_bgwriter[]", "A", array_oid=0, element_oid=12295
    ),
    BuiltinType(
        12298,
        "_pg_stat_checkpointer",
        "pg_stat_checkpointer[]",
        "A",
        array_oid=0,
        element_oid=12299,
    ),
    BuiltinType(12302, "_pg_stat_io", "pg_stat_io[]", "A", array_oid=0, element_oid=12303),
    BuiltinType(12306, "_pg_stat_wal", "pg_stat_wal[]", "A", array_oid=0, element_oid=12307),
    BuiltinType(
        12310,
        "_pg_stat_progress_analyze",
        "pg_stat_progress_analyze[]",
        "A",
        array_oid=0,
        element_oid=12311,
    ),
    BuiltinType(
        12315,
        "_pg_stat_progress_vacuum",
        "pg_stat_progress_vacuum[]",
        "A",
        array_oid=0,
        element_oid=12316,
    ),
    BuiltinType(
        12320,
        "_pg_stat_progress_cluster",
        "pg_stat_progress_cluster[]",
        "A",
        array_oid=0,
        element_oid=12321,
    ),
    BuiltinType(
        12325,
        "_pg_stat_progress_create_index",
        "pg_stat_progress_create_index[]",
        "A",
        array_oid=0,
        element_oid=12326,
    ),
    BuiltinType(
        12330,
        "_pg_stat_progress_basebackup",
        "pg_stat_progress_basebackup[]",
        "A",
        array_oid=0,
        element_oid=12331,
    ),
    BuiltinType(
        12334,
        "_pg_stat_progress_copy",
        "pg_stat_progress_copy[]",
        "A",
        array_oid=0,
        element_oid=12335,
    ),
    BuiltinType(
        12339, "_pg_user_mappings", "pg_user_mappings[]", "A", array_oid=0, element_oid=12340
    ),
    BuiltinType(
        12344,
        "_pg_replication_origin_status",
        "pg_replication_origin_status[]",
        "A",
        array_oid=0,
        element_oid=12345,
    ),
    BuiltinType(
        12348,
        "_pg_stat_subscription_stats",
        "pg_stat_subscription_stats[]",
        "A",
        array_oid=0,
        element_oid=12349,
    ),
    BuiltinType(12352, "_pg_wait_events", "pg_wait_events[]", "A", array_oid=0, element_oid=12353),
    BuiltinType(12356, "_pg_aios", "pg_aios[]", "A", array_oid=0, element_oid=12357),
)

BY_OID: dict[int, BuiltinType] = {t.oid: t for t in BUILTIN_TYPES}
BY_SQL_NAME: dict[str, BuiltinType] = {t.sql_name: t for t in BUILTIN_TYPES}
BY_NAME: dict[str, BuiltinType] = {t.name: t for t in BUILTIN_TYPES}


@dataclass(frozen=True, slots=True)
class TypeInfo:
    """What decoding needs to know about a type that is not built in (from pg_type)."""

    oid: int
    namespace: str
    name: str
    # pg_type.typtype: 'b' base, 'e' enum, 'd' domain, 'c' composite, 'r' range, 'm' multirange.
    kind: str = "b"
    # A domain's base type; for arrays, the element type; for a range, its subtype (and for a
    # multirange, its range type). 0 when not known.
    base_oid: int = 0
    element_oid: int = 0
    # A domain's type modifier (pg_type.typtypmod, e.g. numeric(10,2)): its columns' own
    # atttypmod is -1, so the Arrow type (decimal precision and scale) comes from here.
    base_modifier: int = -1
