"""tlc.passes"""
